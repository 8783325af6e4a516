#!/usr/bin/env bash
# Everything a device call carries, from a fresh checkout (session 29): build-dev configured for
# sm_90 without PTX (the PTX alone made the two binaries 50 MB of xz each), built, packed as one
# tar.xz (bench/pack_binaries.sh), the shared libraries the device image lacks (ldd of gyre:
# PCRE2, cpp-httplib, brotli, OpenSSL) in .device/libs, and the fixtures the CUDA tests read
# (stories260K, tinystories-sample.txt) in .device/shared. Then: run with carry
# [".device/lead", ".device/libs", ".device/shared"] and e.g. `bash bench/session29_device.sh first`.
# About 13 minutes on the 2-core build box from nothing; the carry is ~40 MB with the tree.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DGYRE_CUDA_ARCHS=90 \
  -DGYRE_CUDA_PTX=OFF >/dev/null
ninja -C build-dev gyre gyre_tests
bench/pack_binaries.sh build-dev
mkdir -p .device/libs .device/shared/fixtures/text
for lib in libpcre2-8.so.0 libcpp-httplib.so.0.11 libbrotlicommon.so.1 libbrotlidec.so.1 \
  libbrotlienc.so.1 libssl.so.3 libcrypto.so.3; do
  cp -L "/lib/x86_64-linux-gnu/$lib" .device/libs/
done
cp -r ../shared/fixtures/stories260K ../shared/fixtures/README.md .device/shared/fixtures/
cp ../shared/fixtures/text/tinystories-sample.txt .device/shared/fixtures/text/
du -sh .device
