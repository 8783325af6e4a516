#!/usr/bin/env bash
# Session 10 device runs, each a separate call on one warm machine. Carry .device/lead/*.xz
# (stripped gyre and gyre_tests, unpacked into .device/bin, which stays while the machine is warm),
# .device/libs (the shared libraries the device lacks) and .device/shared/fixtures/{stories260K,
# text}. Logs land in $OUT; the summary is printed at the end.
#   bench/session10_device.sh tests [FILTER]   the CUDA tests (quantizer, mixes, trellis,
#                                      kernels, models), or those of a gtest filter
#   bench/session10_device.sh convert ["MODES"]  synthetic llama3-8b conversions of 4 blocks:
#                                      scalar GPTQ with and without mixes, and --trellis (the
#                                      phase breakdowns); MODES a subset of "no_mixes mixes trellis"
#   bench/session10_device.sh quick|final FILTER   tests, then the 4-block (quick) or the cut
#                                      32-block (final) trellis conversion, in one call
#   bench/session10_device.sh trellis32 [SECONDS]  the full 32-block --trellis conversion, cut
#                                      after SECONDS (default 560): its per-block rates project
#                                      the whole time when it does not finish
set -u
OUT=${OUT:-/tmp/out}
mkdir -p .device/bin "$OUT"
[ -e /work/shared ] || { mkdir -p /work && ln -s "$PWD/.device/shared" /work/shared; }
if [ -d .device/lead ]; then
  for f in .device/lead/*.xz; do
    b=.device/bin/$(basename "$f" .xz)
    [ "$f" -nt "$b" ] || continue
    xz -dc "$f" >"$b" && chmod +x "$b"
  done
fi
cp .device/libs/* .device/bin/ 2>/dev/null
[ -x .device/bin/gyre ] || { echo "no .device/bin/gyre (a fresh machine?)"; exit 3; }
export LD_LIBRARY_PATH=$PWD/.device/bin:${LD_LIBRARY_PATH:-}
B=.device/bin
SUMMARY=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$SUMMARY"
git log -1 --format='commit %h %s' 2>/dev/null | tee -a "$SUMMARY"
case "${1:-tests}" in
quick)  # the tests of a gtest filter, then the 4-block trellis conversion, in one call
  env -u LD_LIBRARY_PATH bash "$0" tests "$2" >/dev/null
  env -u LD_LIBRARY_PATH bash "$0" convert trellis >/dev/null
  ;;
final)  # the tests of a gtest filter, then the 32-block trellis conversion until ~560 s in all
  env -u LD_LIBRARY_PATH bash "$0" tests "$2" >/dev/null
  grep -E "trellis GPU encoder|bit-identical" "$OUT/tests.log" >>"$SUMMARY"
  env -u LD_LIBRARY_PATH bash "$0" trellis32 $((560 - SECONDS)) >/dev/null
  ;;
tests)
  timeout 400 $B/gyre_tests --gtest_filter="${2:-*Cuda*:*Trellis*:*Hadamard*:*QuantMix*}" \
    >"$OUT/tests.log" 2>&1
  echo "tests rc=$?: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/tests.log" | tr '\n' ' ')" >>"$SUMMARY"
  grep -E '^\[  FAILED|Failure|Expected|Which is|actual' "$OUT/tests.log" | head -40 >>"$SUMMARY"
  ;;
convert)
  for mode in ${2:-no_mixes mixes trellis}; do
    flag=()
    [ $mode = no_mixes ] && flag=(--no-mixes)
    [ $mode = trellis ] && flag=(--trellis)
    t0=$(date +%s.%N)
    timeout 280 $B/gyre convert --synthetic llama3-8b --synthetic-layers 4 --head-bits 0 --bpw 4.0 \
      "${flag[@]}" -o /tmp/syn_$mode >"$OUT/syn_$mode.log" 2>&1
    rc=$? t1=$(date +%s.%N)
    echo "synthetic 8B x4 blocks $mode rc=$rc wall $(awk "BEGIN{print $t1 - $t0}") s" >>"$SUMMARY"
    grep -E "^convert:|^sensitivity:" "$OUT/syn_$mode.log" | cut -c1-600 >>"$SUMMARY"
  done
  ;;
trellis32)
  t0=$(date +%s.%N)
  timeout "${2:-560}" $B/gyre convert --synthetic llama3-8b --head-bits 0 --bpw 4.0 --trellis \
    -o /tmp/syn_t32 >"$OUT/syn_t32.log" 2>&1
  rc=$? t1=$(date +%s.%N)
  echo "synthetic 8B x32 blocks trellis rc=$rc wall $(awk "BEGIN{print $t1 - $t0}") s" >>"$SUMMARY"
  grep -E "^convert:|^sensitivity:" "$OUT/syn_t32.log" | cut -c1-600 >>"$SUMMARY"
  grep -E "rel. error" "$OUT/syn_t32.log" | tail -3 >>"$SUMMARY"
  ;;
esac
cat "$SUMMARY"
