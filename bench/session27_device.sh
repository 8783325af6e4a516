#!/usr/bin/env bash
# Session 27 device runs (carry .device/lead = gyre_tests.xz, .device/lead2 = gyre.xz, .device/libs,
# .device/shared; see bench/device_binaries.sh, which also has bench_line).
#   bench/session27_device.sh tests    the CUDA tests of every 8-bit weight path with the tiled 8-bit
#       layout (opt-in: GYRE_CUDA_BITS8_STREAM=1 for the whole run, so that the loaders' and mixed
#       weights' tests take it too) and of the other stream-GEMV users (FILTER overrides)
#   bench/session27_device.sh eight    8-bit decode of the Llama-3-8B shape: the tiled layout and
#       stream GEMV (GYRE_CUDA_BITS8_STREAM=1) against the host layout and its CUDA-core GEMV
#       (GYRE_CUDA_BITS8_STREAM=0), ROUNDS rounds interleaved; warp budgets (GYRE_CUDA_BITS_WARPS);
#       prefill 2048; serving at 1, 8 and 32 requests both ways; 4-bit once for the machine
#   bench/session27_device.sh short    `eight`'s A/B (2 rounds) and serving only
#   bench/session27_device.sh table    the final table (bench/device_table.sh)
set -u
serve_line() {  # serve_line LABEL BINARY BITS: the serving bench at 1, 8 and 32 requests
  local label=$1 bin=$2 bits=$3
  timeout 200 "$bin" bench --synthetic llama3-8b --bits "$bits" -n 128 -p 16 --concurrency 1,8,32 \
    >"$O/s.log" 2>&1
  echo "$label serving:"
  grep -A4 -E "^requests" "$O/s.log" || tail -3 "$O/s.log"
}
for mode in "$@"; do
  case "$mode" in
  tests)
    . bench/device_binaries.sh
    GYRE_CUDA_BITS8_STREAM=1 device_tests "${FILTER:-CudaQbits*:CudaQlinear*:QuantFormatsCuda*:QMixedCuda*:Exl2Cuda*:FusedWeights*:CudaFused*:CudaGemv4*:CudaStories*:CudaForward*:CudaDecodeGraphs*:FedDecode*:CudaActOrder*:CudaHadamard*}" 300
    grep -cE "^\[       OK \]" "$O/tests.log"
    ;;
  eight)
    . bench/device_binaries.sh >/dev/null
    for r in $(seq 1 "${ROUNDS:-2}"); do
      GYRE_CUDA_BITS8_STREAM=1 bench_line "r$r 8-bit tiled" $B/gyre --synthetic llama3-8b --bits 8 -p 512 -n 128 --long 0
      GYRE_CUDA_BITS8_STREAM=0 bench_line "r$r 8-bit host layout" $B/gyre --synthetic llama3-8b \
        --bits 8 -p 512 -n 128 --long 0
    done
    for w in 16 32 64; do
      GYRE_CUDA_BITS8_STREAM=1 GYRE_CUDA_BITS_WARPS=$w bench_line "8-bit tiled, warps $w" $B/gyre --synthetic llama3-8b \
        --bits 8 -p 512 -n 128 --long 0
    done
    GYRE_CUDA_BITS8_STREAM=1 GYRE_CUDA_BITS_SMEM=0 bench_line "8-bit tiled, register ring" $B/gyre --synthetic llama3-8b \
      --bits 8 -p 512 -n 128 --long 0
    GYRE_CUDA_BITS8_STREAM=1 bench_line "8-bit tiled long" $B/gyre --synthetic llama3-8b --bits 8 -p 2048 -n 128 --long 8192
    GYRE_CUDA_BITS8_STREAM=0 bench_line "8-bit host long" $B/gyre --synthetic llama3-8b --bits 8 \
      -p 2048 -n 128 --long 8192
    bench_line "4-bit" $B/gyre --synthetic llama3-8b --bits 4 -p 512 -n 128 --long 0
    GYRE_CUDA_BITS8_STREAM=1 serve_line "8-bit tiled" $B/gyre 8
    GYRE_CUDA_BITS8_STREAM=0 serve_line "8-bit host" $B/gyre 8
    ;;
  short)  # the A/B of `eight` alone, for a short call
    . bench/device_binaries.sh >/dev/null
    for r in 1 2; do
      GYRE_CUDA_BITS8_STREAM=1 bench_line "r$r 8-bit tiled" $B/gyre --synthetic llama3-8b --bits 8 -p 512 -n 128 --long 0
      GYRE_CUDA_BITS8_STREAM=0 bench_line "r$r 8-bit host layout" $B/gyre --synthetic llama3-8b \
        --bits 8 -p 512 -n 128 --long 0
    done
    GYRE_CUDA_BITS8_STREAM=1 serve_line "8-bit tiled" $B/gyre 8
    GYRE_CUDA_BITS8_STREAM=0 serve_line "8-bit host" $B/gyre 8
    ;;
  table)
    bash bench/session25_device.sh table
    ;;
  esac
done
