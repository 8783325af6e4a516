# Sourced by the session device scripts (bench/session*_device.sh), run from the repository root
# on the device: unpacks the carried binaries (.device/lead*/NAME.xz, newer than .device/bin/NAME)
# and libraries into .device/bin, links the carried fixtures to /work/shared, and sets B (the
# binaries), O (the output folder) and LD_LIBRARY_PATH; prints the GPU.
[ -e /work/shared ] || { mkdir -p /work && ln -s "$PWD/.device/shared" /work/shared 2>/dev/null; }
mkdir -p .device/bin
for f in .device/lead*/*.xz; do
  [ -e "$f" ] || continue
  b=.device/bin/$(basename "$f" .xz)
  [ "$f" -nt "$b" ] || continue
  xz -dc "$f" >"$b" && chmod +x "$b"
done
cp .device/libs/* .device/bin/ 2>/dev/null
export LD_LIBRARY_PATH=$PWD/.device/bin:${LD_LIBRARY_PATH:-}
B=.device/bin
O=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader

# device_tests FILTER SECONDS: gyre_tests with that filter into $O/tests.log, then its summary.
device_tests() {
  timeout "$2" $B/gyre_tests --gtest_filter="$1" >"$O/tests.log" 2>&1
  echo "tests rc=$?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED  \]|Failure|Expected|Which is" "$O/tests.log" | head -30
}
