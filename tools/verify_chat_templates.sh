#!/usr/bin/env bash
# Checks the chat-template fixtures that were typed by hand against published copies on PyPI:
# llama.cpp keeps the Hugging Face templates of Llama-3.1-8B-Instruct and Qwen2.5-7B-Instruct
# (downloaded from the Hub by its scripts/get_chat_template.py) in models/templates/, and the
# llama-cpp-python source distribution vendors that folder. Needs network access to PyPI.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
version=${1:-0.3.36}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
url=$(python3 - "$version" <<'PY'
import json, sys, urllib.request
from urllib.parse import urljoin
index = "https://pypi.org/pypi/llama-cpp-python/json"
d = json.load(urllib.request.urlopen(index))
files = d["releases"].get(sys.argv[1]) or d["urls"]
print(urljoin(index, next(u["url"] for u in files if u["packagetype"] == "sdist")))
PY
)
curl -sSL -o "$tmp/sdist.tar.gz" "$url"
tar -xzf "$tmp/sdist.tar.gz" -C "$tmp" --wildcards '*/models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja' \
  '*/models/templates/Qwen-Qwen2.5-7B-Instruct.jinja'
published=$(dirname "$(find "$tmp" -name 'Qwen-Qwen2.5-7B-Instruct.jinja')")
status=0
check() {
  if cmp -s "$here/tests/data/chat_templates/$1" "$published/$2"; then
    echo "identical: $1 == llama-cpp-python $version $2"
  else
    echo "DIFFERENT: $1 vs $2"; diff "$here/tests/data/chat_templates/$1" "$published/$2" | head -20; status=1
  fi
}
check llama3_1_tools.jinja meta-llama-Llama-3.1-8B-Instruct.jinja
check qwen2_5.jinja Qwen-Qwen2.5-7B-Instruct.jinja
exit $status
