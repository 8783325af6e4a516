#!/usr/bin/env bash
# Session 28 device runs (carry .device/lead = gyre_tests.xz, .device/lead2 = gyre.xz, .device/libs,
# .device/shared; see bench/device_binaries.sh).
#   bench/session28_device.sh tests   the CUDA tests of the stream-GEMV users with the tiled 8-bit
#       layout on for the whole run (GYRE_CUDA_BITS8_STREAM=1), then those of the 4- and 8-bit
#       ring kernels (and 6-bit's) again with undecoded fragments on for the whole run
#       (GYRE_CUDA_RAW_FRAGMENTS=1)
#   bench/session28_device.sh quick   the kernels' and engine's tests once, both switches on
#   bench/session28_device.sh mini    a short call: the kernels' tests, one round of 4- and 8-bit
#   bench/session28_device.sh ab      decode of the Llama-3-8B shape, ROUNDS (2) rounds
#       interleaved: 4- and 6-bit as today and with undecoded fragments (4-bit: both ways, 1 and 2);
#       8-bit on the host layout,
#       tiled, tiled with undecoded fragments
#   bench/session28_device.sh more    8-bit long context and serving, tiled against the host layout
#   bench/session28_device.sh table   the final table (bench/device_table.sh)
set -u
. bench/device_binaries.sh
serve_line() {  # serve_line LABEL BITS: the serving bench at 1, 8 and 32 requests
  timeout 200 $B/gyre bench --synthetic llama3-8b --bits "$2" -n 128 -p 16 --concurrency 1,8,32 \
    >"$O/s.log" 2>&1
  echo "$1 serving:"
  grep -A4 -E "^requests" "$O/s.log" || tail -3 "$O/s.log"
}
for mode in "$@"; do
  case "$mode" in
  tests)
    GYRE_CUDA_BITS8_STREAM=1 device_tests "${FILTER:-CudaQbits*:CudaQlinear*:QuantFormatsCuda*:QMixedCuda*:Exl2Cuda*:FusedWeights*:CudaFused*:CudaGemv4*:CudaStories*:CudaForward*:CudaDecodeGraphs*:FedDecode*:CudaActOrder*:CudaHadamard*}" 240
    cp "$O/tests.log" "$O/tests_bits8.log"
    GYRE_CUDA_BITS8_STREAM=1 GYRE_CUDA_RAW_FRAGMENTS=1 device_tests "${FILTER_RAW:-CudaGemv4*:CudaQbits*:CudaFused*:FusedWeights*:QuantFormatsCuda*:CudaStories*:CudaForward*:FedDecode*}" 200
    ;;
  quick)  # one test run with both switches on (the kernels' own tests set each way themselves)
    GYRE_CUDA_BITS8_STREAM=1 GYRE_CUDA_RAW_FRAGMENTS=1 device_tests "${FILTER:-CudaGemv4*:CudaQbits*:CudaStories*:CudaForward*:FedDecode*:CudaFused*:QuantFormatsCuda*}" 200
    grep -cE "^\[       OK \]" "$O/tests.log"
    ;;
  mini)  # a short call: the kernels' tests (both switches on), then one round of the main A/B
    GYRE_CUDA_BITS8_STREAM=1 GYRE_CUDA_RAW_FRAGMENTS=1 device_tests "CudaGemv4.MatchesFloat64:CudaQbits.EightBitTiledMatchesFloat64:CudaQbits.OldAndNewDecodeMatchFloat64:CudaStories*" 100
    bench_line "4-bit" $B/gyre --synthetic llama3-8b --bits 4 -p 512 -n 128 --long 0
    GYRE_CUDA_RAW_FRAGMENTS=1 bench_line "4-bit raw" $B/gyre --synthetic llama3-8b --bits 4 -p 512 -n 128 --long 0
    GYRE_CUDA_RAW_FRAGMENTS=2 bench_line "4-bit raw2" $B/gyre --synthetic llama3-8b --bits 4 -p 512 -n 128 --long 0
    GYRE_CUDA_BITS8_STREAM=1 GYRE_CUDA_RAW_FRAGMENTS=1 bench_line "8-bit tiled raw" $B/gyre --synthetic llama3-8b --bits 8 -p 512 -n 128 --long 0
    GYRE_CUDA_BITS8_STREAM=0 bench_line "8-bit host" $B/gyre --synthetic llama3-8b --bits 8 -p 512 -n 128 --long 0
    GYRE_CUDA_BITS8_STREAM=1 bench_line "8-bit tiled" $B/gyre --synthetic llama3-8b --bits 8 -p 512 -n 128 --long 0
    ;;
  ab)
    for r in $(seq 1 "${ROUNDS:-2}"); do
      bench_line "r$r 4-bit" $B/gyre --synthetic llama3-8b --bits 4 -p 512 -n 128 --long 0
      GYRE_CUDA_RAW_FRAGMENTS=1 bench_line "r$r 4-bit raw" $B/gyre --synthetic llama3-8b --bits 4 \
        -p 512 -n 128 --long 0
      GYRE_CUDA_RAW_FRAGMENTS=2 bench_line "r$r 4-bit raw2" $B/gyre --synthetic llama3-8b --bits 4 \
        -p 512 -n 128 --long 0
      bench_line "r$r 6-bit" $B/gyre --synthetic llama3-8b --bits 6 -p 512 -n 128 --long 0
      GYRE_CUDA_RAW_FRAGMENTS=1 bench_line "r$r 6-bit raw" $B/gyre --synthetic llama3-8b --bits 6 \
        -p 512 -n 128 --long 0
      GYRE_CUDA_BITS8_STREAM=0 bench_line "r$r 8-bit host layout" $B/gyre --synthetic llama3-8b \
        --bits 8 -p 512 -n 128 --long 0
      GYRE_CUDA_BITS8_STREAM=1 bench_line "r$r 8-bit tiled" $B/gyre --synthetic llama3-8b --bits 8 \
        -p 512 -n 128 --long 0
      GYRE_CUDA_BITS8_STREAM=1 GYRE_CUDA_RAW_FRAGMENTS=1 bench_line "r$r 8-bit tiled raw" $B/gyre \
        --synthetic llama3-8b --bits 8 -p 512 -n 128 --long 0
    done
    ;;
  more)
    GYRE_CUDA_BITS8_STREAM=1 bench_line "8-bit tiled long" $B/gyre --synthetic llama3-8b --bits 8 \
      -p 2048 -n 128 --long 8192
    GYRE_CUDA_BITS8_STREAM=0 bench_line "8-bit host long" $B/gyre --synthetic llama3-8b --bits 8 \
      -p 2048 -n 128 --long 8192
    GYRE_CUDA_BITS8_STREAM=1 serve_line "8-bit tiled" 8
    GYRE_CUDA_BITS8_STREAM=0 serve_line "8-bit host" 8
    ;;
  table)
    . bench/device_table.sh
    ;;
  esac
done
