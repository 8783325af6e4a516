#!/usr/bin/env bash
# Device-side entry when the binaries travel compressed (they outgrew one transfer): unpacks
# .device/main/*.xz (made here with `xz` from stripped gyre and gyre_tests built for sm_90) into
# .device/bin with the shared libraries of .device/libs, then runs bench/device_run.sh (CUDA tests
# and the benchmark tables; GYRE_BENCH_MODELS / GYRE_SERVE_MODELS choose what runs).
set -u
mkdir -p .device/bin
for f in .device/main/*.xz; do
  dst=.device/bin/$(basename "$f" .xz)
  xz -dc "$f" >"$dst" 2>/dev/null ||
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$f" "$dst"
  chmod +x "$dst"
done
cp .device/libs/* .device/bin/ 2>/dev/null
exec bash bench/device_run.sh
