#!/usr/bin/env bash
# Session 33 device calls (carry .device/lead, .device/libs, .device/shared). Logs into $OUT.
#   bench/session33_device.sh attn   (binaries built with bench/session33_attn_minb.patch applied)
#       does the decode attention's register footprint (239 registers, one 256-thread block per
#       SM: no room beside the q|k|v GEMV's blocks, nor for o_proj's blocks beside it) cost the
#       chain? The tests of the fused decode attention with GYRE_CUDA_ATTN_MINB=2 (at most 128
#       registers) and 3 (85), then 4-bit decode of the Llama-3-8B shape ROUNDS (2) times: default,
#       MINB=2, MINB=3, attnwork (the kernel launched empty), attnlight (a few-register empty kernel
#       in its place); then @8k default, MINB=2 and 3
#   bench/session33_device.sh serve  one-block 2/3-bit pieces taken two to a serving-batch unit:
#       the narrow kernels' tests, serving at 2 and 3 bits (1, 8, 32 requests), decode at 2 and 3
#       bits, (ATTN=1, binaries with bench/session33_attn_minb.patch) 4-bit decode with the
#       attention, without it, with attnlight and with attnearly (the empty kernel letting the
#       next one in before its wait), then every GPU test until CHECK_END (420) s
set -u
O=${OUT:-/tmp}
mode=${1:-serve}
set --
. bench/session29_device.sh  # (no mode: defines dec, device_tests, B; unpacks the carry)
. bench/session28_device.sh  # (no mode: defines serve_line)
if [ "$mode" = attn ]; then
  GYRE_CUDA_ATTN_MINB=2 device_tests "CudaAttentionCombine*:CudaDecodeAttention*:CudaStories*:CudaForward*:FedDecodeCuda*:CudaDecodeGraphs*" 120
  cp "$O/tests.log" "$O/tests_minb2.log"
  GYRE_CUDA_ATTN_MINB=3 device_tests "CudaAttentionCombine*:CudaDecodeAttention*:CudaStories*" 60
  cp "$O/tests.log" "$O/tests_minb3.log"
  for r in $(seq 1 "${ROUNDS:-2}"); do
    dec "r$r 4-bit" 4 X=0
    dec "r$r 4-bit attn minb 2" 4 GYRE_CUDA_ATTN_MINB=2
    dec "r$r 4-bit attn minb 3" 4 GYRE_CUDA_ATTN_MINB=3
    dec "r$r 4-bit attnwork (results wrong)" 4 GYRE_DIAG_SKIP=attnwork
    dec "r$r 4-bit attnlight (results wrong)" 4 GYRE_DIAG_SKIP=attnlight
  done
  for m in 1 2 3; do
    GYRE_CUDA_ATTN_MINB=$m bench_line "4-bit @8k minb $m" $B/gyre --synthetic llama3-8b --bits 4 \
      -p 2048 -n 128 --long 8192
  done
elif [ "$mode" = serve ]; then
  device_tests "CudaQbits*:QMixedCuda*:CudaQlinearBStream*:CudaStories*" 150
  cp "$O/tests.log" "$O/tests_narrow.log"
  serve_line "2-bit" 2
  serve_line "3-bit" 3
  dec "2-bit" 2 X=0
  dec "3-bit" 3 X=0
  if [ -n "${ATTN:-}" ]; then  # binaries with bench/session33_attn_minb.patch
    dec "4-bit" 4 X=0
    dec "4-bit without attention (results wrong)" 4 GYRE_DIAG_SKIP=attn
    dec "4-bit attnlight (results wrong)" 4 GYRE_DIAG_SKIP=attnlight
    dec "4-bit attnearly (results wrong)" 4 GYRE_DIAG_SKIP=attnearly
  fi
  left=$((${CHECK_END:-420} - SECONDS))
  [ "$left" -gt 60 ] && device_tests "*Cuda*:FusedWeights*:FedDecode*" "$left"
  grep -cE "^\[       OK \]" "$O/tests.log"
fi
echo "wall $SECONDS s"
