#!/usr/bin/env bash
# Session 22 device runs (carry .device/lead2 = stripped gyre as .xz, or .device/lead =
# gyre_tests.xz, and .device/libs, .device/shared; see bench/device_binaries.sh).
#   bench/session22_device.sh ab|ncuattn        as bench/session21_device.sh (ARMS, ROUNDS, SHAPE)
#   bench/session22_device.sh tests             the attention, paged, forward, serving and SmolLM2
#       tests (SmolLM2's GGUF: bench/session14_device.sh smolpart A, then B, first)
#   bench/session22_device.sh serve             serving at 1, 8, 32 requests, tensor-core and scalar
#       decode attention (GYRE_CUDA_ATTN_MMA=0)
#   bench/session22_device.sh long              decode at 32k keys, the same two arms
set -u
for mode in "$@"; do
  case "$mode" in
  tests)
    . bench/device_binaries.sh
    device_tests "${FILTER:-CudaSmolLM2*:*Attention*:*Paged*:CudaForward*:CudaStories*:*Serving*:CudaRope*:CudaDecode*:CudaActOrder*:CudaFused*:QMixedCuda*:CudaGemv4*:CudaQbits*}" 400
    ;;
  serve | long)
    . bench/device_binaries.sh
    for arm in - GYRE_CUDA_ATTN_MMA=0; do
      echo "== $mode [$arm]"
      envs=()
      [ "$arm" != - ] && envs=("$arm")
      if [ "$mode" = serve ]; then
        env "${envs[@]}" timeout 200 $B/gyre bench --synthetic llama3-8b --bits 4 -n 128 -p 16 \
          --concurrency 1,8,32 2>&1 | tail -6 | head -4
      else
        env "${envs[@]}" timeout 150 $B/gyre bench --synthetic llama3-8b --bits 4 -p 512 -n 64 \
          --long 32768 2>&1 | tail -4
      fi
    done
    ;;
  *)
    bash bench/session21_device.sh "$mode"
    ;;
  esac
done
