#!/usr/bin/env bash
# Packs build-dev's gyre and gyre_tests, stripped, as .device/lead/binaries.tar.xz for a device
# call (bench/device_binaries.sh unpacks it). One xz stream with a dictionary larger than one
# binary stores the CUDA kernels both link once: 33 MB where two .xz files took 63 MB (session 29),
# which with the libraries and the tree passed the 64 MiB a call carries.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-dev}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
strip -o "$tmp/gyre" "$build/gyre"
strip -o "$tmp/gyre_tests" "$build/gyre_tests"
mkdir -p .device/lead
rm -f .device/lead/*.xz .device/lead2/*.xz
tar cf - -C "$tmp" gyre gyre_tests | xz -T1 --lzma2=preset=6,dict=192MiB >.device/lead/binaries.tar.xz
ls -la .device/lead/binaries.tar.xz
