#!/usr/bin/env bash
# Session 25 device runs (carry .device/lead = gyre_tests.xz, .device/lead2 = gyre.xz, .device/lead3 =
# gyre_old.xz (main before the lean ring loop), .device/libs, .device/shared; see
# bench/device_binaries.sh).
#   bench/session25_device.sh ceiling  build and run bench/stream_ceiling.cu (adds the lean loop and
#       the offset fold to session 24's variants)
#   bench/session25_device.sh tests    every CUDA test of the stream GEMV's users: 4-bit, narrow
#       widths, mixed pairs, trellis, Hadamard-rotated, fused weights, the forward passes (FILTER
#       overrides)
#   bench/session25_device.sh race     compute-sanitizer racecheck of one test (BIN, FILTER)
#   bench/session25_device.sh busy     CudaGemv4.MatchesFloat64WhileDramIsBusy with the staged-scale
#       race put back (.device/lead4/gyre_tests_bug.xz: gyre_tests built with
#       bench/session25_scale_race.patch applied, which moves the staged scale read before the first
#       piece's wait) three times, then with the fixed binary; the bug binary should fail
#   bench/session25_device.sh ab       decode of the Llama-3-8B shape, the old binary against the new,
#       interleaved (ROUNDS rounds): 4 bits (new also with a ring of 2 and with
#       GYRE_CUDA_NORM_AHEAD=0 and with per-piece scales), then 5 and 6 bits, then 2 and 3 bits with
#       and without the shared-memory ring
#   bench/session25_device.sh long     -p 2048 --long 8192 at 4 bits, old against new
#   bench/session25_device.sh table    the final table (bench/device_table.sh)
set -u
bench_line() {  # bench_line LABEL BINARY ARGS...: one gyre bench --json run, one line
  local label=$1 bin=$2
  shift 2
  timeout 60 "$bin" bench "$@" --json >"$O/b.json" 2>"$O/b.err"
  python3 -c "import json; d=json.load(open('$O/b.json')); print('$label: prefill %.0f decode@128 %.1f (%.1f%%) decode@long %s bw %.0f' % (d['prefill_tok_s'], d['decode_short_tok_s'], 100*d['decode_short_roofline'], ('%.1f (%.1f%%)' % (d['decode_long_tok_s'], 100*d['decode_long_roofline'])) if d.get('decode_long_tok_s') else '-', d.get('bandwidth_gb_s', 0)))" 2>&1 || tail -3 "$O/b.err"
}
for mode in "$@"; do
  case "$mode" in
  ceiling)  # the same build and run as session 24's; the variant list is stream_ceiling.cu's
    bash bench/session24_device.sh ceiling
    ;;
  tests)
    . bench/device_binaries.sh
    device_tests "${FILTER:-CudaGemv4*:CudaQbits*:QMixedCuda*:CudaQlinear*:CudaFused*:CudaTrellis*:CudaHadamard*:CudaActOrder*:FusedWeights*:CudaForward*:CudaStories*:CudaDecodeGraphs*:Exl2Cuda*:QuantFormatsCuda*:CudaSmolLM2*:CudaHfReference*}" 280
    grep -cE "^\[       OK \]" "$O/tests.log"
    ;;
  busy)
    . bench/device_binaries.sh >/dev/null
    for b in gyre_tests_bug gyre_tests_bug gyre_tests_bug gyre_tests; do
      timeout 60 $B/$b --gtest_filter=CudaGemv4.MatchesFloat64WhileDramIsBusy >"$O/$b.busy.log" 2>&1
      echo "$b rc=$?"
      grep -E "^\[  (PASSED|FAILED) |Which is|launch [0-9]+" "$O/$b.busy.log" | head -4
    done
    ;;
  race)  # compute-sanitizer racecheck over the 4-bit ring's epilogue test: BIN (default gyre_tests)
    . bench/device_binaries.sh >/dev/null
    CS=$(dirname "$(command -v nvcc)")/compute-sanitizer
    timeout "${RACE_S:-150}" "$CS" --tool racecheck --racecheck-report hazard "$B/${BIN:-gyre_tests}" \
      --gtest_filter="${FILTER:-CudaGemv4.SwigluAndSplitMatchFloat64}" >"$O/race.log" 2>&1
    echo "racecheck ${BIN:-gyre_tests} rc=$?"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|PASSED|FAILED" "$O/race.log" | sort | uniq -c | head -12
    ;;
  ab)  # the old binary's lines only where .device/lead3/gyre_old.xz was carried
    . bench/device_binaries.sh >/dev/null
    for r in $(seq 1 "${ROUNDS:-2}"); do
      [ -x $B/gyre_old ] && bench_line "round $r old 4-bit" $B/gyre_old --synthetic llama3-8b --bits 4 -p 512 -n 128 --long 0
      bench_line "round $r new 4-bit" $B/gyre --synthetic llama3-8b --bits 4 -p 512 -n 128 --long 0
      GYRE_CUDA_GEMV_SMEM=2 bench_line "round $r new 4-bit ring of 2" $B/gyre --synthetic llama3-8b \
        --bits 4 -p 512 -n 128 --long 0
      GYRE_CUDA_NORM_AHEAD=0 bench_line "round $r new 4-bit, norm weights after the wait" $B/gyre \
        --synthetic llama3-8b --bits 4 -p 512 -n 128 --long 0
      GYRE_CUDA_STREAM_SCALES=ring bench_line "round $r new 4-bit, per-piece scales" $B/gyre \
        --synthetic llama3-8b --bits 4 -p 512 -n 128 --long 0
    done
    for bits in 5 6; do
      [ -x $B/gyre_old ] && bench_line "old $bits-bit" $B/gyre_old --synthetic llama3-8b --bits $bits -p 512 -n 128 --long 0
      bench_line "new $bits-bit" $B/gyre --synthetic llama3-8b --bits $bits -p 512 -n 128 --long 0
    done
    for bits in 2 3; do  # the shared-memory ring at 2 and 3 bits (off by default: session 12)
      bench_line "new $bits-bit" $B/gyre --synthetic llama3-8b --bits $bits -p 512 -n 128 --long 0
      GYRE_CUDA_BITS_SMEM=4 bench_line "new $bits-bit, ring of 4" $B/gyre --synthetic llama3-8b --bits $bits -p 512 -n 128 --long 0
    done
    ;;
  long)
    . bench/device_binaries.sh >/dev/null
    for r in 1 2; do
      [ -x $B/gyre_old ] && bench_line "round $r old 4-bit" $B/gyre_old --synthetic llama3-8b --bits 4 -p 2048 -n 128 --long 8192
      bench_line "round $r new 4-bit" $B/gyre --synthetic llama3-8b --bits 4 -p 2048 -n 128 --long 8192
    done
    ;;
  table)
    . bench/device_binaries.sh >/dev/null
    . bench/device_table.sh
    ;;
  esac
done
