#!/usr/bin/env bash
# Session 22 device runs (carry .device/lead2 = stripped gyre as .xz, or .device/lead =
# gyre_tests.xz, and .device/libs, .device/shared; see bench/device_binaries.sh).
#   bench/session22_device.sh ab|ncuattn        as bench/session21_device.sh (ARMS, ROUNDS, SHAPE)
#   bench/session22_device.sh tests             the attention, paged, forward, serving and SmolLM2
#       tests (SmolLM2's GGUF: bench/session14_device.sh smolpart A, then B, first)
#   bench/session22_device.sh serve             serving at 1, 8, 32 requests, tensor-core and scalar
#       decode attention (GYRE_CUDA_ATTN_MMA=0)
#   bench/session22_device.sh long              decode at 32k keys, the same two arms
#   bench/session22_device.sh ref25             unpack gyre-ref-25M (carry .device/ref25 alone: the
#       binary does not fit beside it), then in the next call (carry .device/lead2, .device/text):
#   bench/session22_device.sh mix68             bench/ref25_quality.sh SET mix68
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
  ref25)
    tar -C /tmp -xJf .device/ref25/ref25.tar.xz && ls /tmp/gyre-ref-25M
    ;;
  mix68)
    . bench/device_binaries.sh
    bash bench/ref25_quality.sh $B/gyre mix68
    ;;
  *)
    bash bench/session21_device.sh "$mode"
    ;;
  esac
done
