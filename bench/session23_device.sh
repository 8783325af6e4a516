#!/usr/bin/env bash
# Session 23 device runs (carry .device/lead2 = stripped gyre as .xz, or .device/lead =
# gyre_tests.xz, and .device/libs, .device/shared; see bench/device_binaries.sh).
#   bench/session23_device.sh tests      the mixed-weight, narrow-width, 4-bit GEMV, EXL2 and
#       fused-weight tests (FILTER overrides)
#   bench/session23_device.sh mix        decode of the Llama-3-8B shape with every weight but the
#       head a two-width mix (GYRE_SYNTHETIC_MIX, as ExLlamaV2's converter sizes a layer's groups),
#       the two-part kernel on and off (GYRE_CUDA_MIXED_ONE=0), then uniform 2/3/5-bit references;
#       MIXES overrides the mixes, ROUNDS the rounds
#   bench/session23_device.sh ab|serve|table|ncu   as bench/session22_device.sh
set -u
for mode in "$@"; do
  case "$mode" in
  tests)
    . bench/device_binaries.sh
    device_tests "${FILTER:-QMixedCuda*:CudaQbits*:CudaGemv4*:CudaQlinear*:CudaExl2*:CudaFused*:CudaForward*:CudaStories*}" 400
    ;;
  mix)
    . bench/device_binaries.sh
    arms=""
    for m in ${MIXES:-4:128:0.1/3:128:0.9 5:128:0.25/4:128:0.75 3:128:0.25/2:128:0.75 6:128:0.25/5:128:0.75}; do
      arms="$arms GYRE_SYNTHETIC_MIX=$m GYRE_SYNTHETIC_MIX=$m,GYRE_CUDA_MIXED_ONE=0"
    done
    ARMS="$arms" bash bench/session15_device.sh ab
    for b in ${REFBITS:-3 2 5}; do ARMS=- BITS=$b ROUNDS=1 bash bench/session15_device.sh ab; done
    ;;
  *)
    bash bench/session22_device.sh "$mode"
    ;;
  esac
done
