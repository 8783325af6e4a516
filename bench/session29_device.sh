#!/usr/bin/env bash
# Session 29 device run (carry .device/lead = binaries.tar.xz from bench/pack_binaries.sh,
# .device/libs, .device/shared; see bench/device_binaries.sh). One short call for what sessions 27
# and 28 wrote without a GPU:
#   bench/session29_device.sh first   the kernels' tests with undecoded fragments and tiled 8-bit
#       weights on (GYRE_CUDA_RAW_FRAGMENTS=1, GYRE_CUDA_BITS8_STREAM=1), then decode of the
#       Llama-3-8B shape: 4-bit as today / undecoded (modes 1 and 2), 8-bit host layout / tiled /
#       tiled undecoded, 6-bit as today / undecoded (ROUNDS=2: the 4-bit three again)
#   bench/session29_device.sh budget  4-bit decode with undecoded fragments (RAW, default 1) at
#       the warp budgets BUDGETS ("0 24 48 64"; 0: the plan's own) (GYRE_CUDA_STREAM_BUDGET: the
#       k-split at n <= 2): fewer instructions per byte may move the best split
#   bench/session29_device.sh tests   the full CUDA test filters both ways (session 28's `tests`)
set -u
. bench/device_binaries.sh
dec() {  # dec LABEL BITS [ENV=V ...]: one decode bench line of the Llama-3-8B shape
  local label=$1 bits=$2
  shift 2
  (
    export "$@"
    bench_line "$label" $B/gyre --synthetic llama3-8b --bits "$bits" -p 512 -n 128 --long 0
  )
}
for mode in "$@"; do
  case "$mode" in
  first)
    GYRE_CUDA_BITS8_STREAM=1 GYRE_CUDA_RAW_FRAGMENTS=1 device_tests "CudaGemv4.MatchesFloat64:CudaQbits.EightBitTiledMatchesFloat64:CudaQbits.OldAndNewDecodeMatchFloat64:CudaStories*" 100
    for r in $(seq 1 "${ROUNDS:-1}"); do
      dec "r$r 4-bit" 4 X=0
      dec "r$r 4-bit raw1" 4 GYRE_CUDA_RAW_FRAGMENTS=1
      dec "r$r 4-bit raw2" 4 GYRE_CUDA_RAW_FRAGMENTS=2
      [ "$r" -ge 2 ] && continue
      dec "8-bit host" 8 GYRE_CUDA_BITS8_STREAM=0
      dec "8-bit tiled" 8 GYRE_CUDA_BITS8_STREAM=1
      dec "8-bit tiled raw" 8 GYRE_CUDA_BITS8_STREAM=1 GYRE_CUDA_RAW_FRAGMENTS=1
      dec "6-bit" 6 X=0
      dec "6-bit raw" 6 GYRE_CUDA_RAW_FRAGMENTS=1
    done
    ;;
  budget)
    for b in ${BUDGETS:-0 24 48 64}; do
      dec "4-bit raw${RAW:-1} budget $b" 4 GYRE_CUDA_RAW_FRAGMENTS="${RAW:-1}" GYRE_CUDA_STREAM_BUDGET="$b"
      dec "4-bit budget $b" 4 GYRE_CUDA_STREAM_BUDGET="$b"
    done
    ;;
  tests)
    bash bench/session28_device.sh tests
    ;;
  esac
done
