#!/usr/bin/env bash
# Session 30 device runs (the carry of bench/prepare_device.sh: .device/lead, .device/libs,
# .device/shared).
#   bench/session30_device.sh first   (run on the binaries of dace649 plus an opt-in attention
#       change, GYRE_CUDA_ATTN_NEWROW, since removed) the kernels' and attention tests with the
#       switches on, then decode of the Llama-3-8B shape: 4-bit as then / undecoded fragments
#       (modes 1, 2) / newrow, 8-bit host / tiled / tiled undecoded, 6-bit / undecoded
#   bench/session30_device.sh tests   every GPU test (names with Cuda, FusedWeights, FedDecode)
#       with today's defaults (tiled 8-bit on), then one decode line each at 4 and 8 bits
#   bench/session30_device.sh ab      ROUNDS (2) interleaved rounds of decode: 4-bit, 8-bit
#       tiled and host layout, 6-bit
set -u
args=("$@")
set --
. bench/session29_device.sh  # (no mode: defines dec, B, O; unpacks the carry)
for mode in "${args[@]}"; do
  case "$mode" in
  tests)
    device_tests "${FILTER:-*Cuda*:FusedWeights*:FedDecode*}" 420
    grep -cE "^\[       OK \]" "$O/tests.log"
    dec "4-bit" 4 X=0
    dec "8-bit" 8 X=0
    ;;
  ab)
    for r in $(seq 1 "${ROUNDS:-2}"); do
      dec "r$r 4-bit" 4 X=0
      dec "r$r 8-bit tiled" 8 X=0
      dec "r$r 8-bit host" 8 GYRE_CUDA_BITS8_STREAM=0
      dec "r$r 6-bit" 6 X=0
    done
    ;;
  esac
done
