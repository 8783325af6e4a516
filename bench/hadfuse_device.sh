#!/bin/bash
# Device call of the fused-rotation work (helper hadfuse, session 8): the rotation and qlinear
# GPU tests, then `gyre bench --synthetic llama3-8b` at 4/3/6 bits in three modes, interleaved,
# in one binary: plain weights (GYRE_SYNTHETIC_HADAMARD=0); rotated the old way (separate
# shared-memory rotate kernel before every matmul, no norm fusion: GYRE_CUDA_FUSED_ROTATION=0
# GYRE_HADAMARD_WARP=0, the dispatch of main before this branch); "unf": the warp-shuffle rotate
# kernel, separate launches (the default after this branch); "new": fused into the decode GEMV's
# staging (GYRE_CUDA_FUSED_ROTATION=1; the default during the two measured calls, now opt-in).
# Expects .device/hadfuse/{gyre,gyre_tests}.xz, .device/libs, .device/shared; writes $OUT/log.
D=.device/hadfuse
xz -dc $D/gyre_tests.xz > /tmp/gt && chmod +x /tmp/gt
xz -dc $D/gyre.xz > /tmp/gyre && chmod +x /tmp/gyre
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | tee -a "$OUT/log"
timeout 110 /tmp/gt --gtest_filter="${FILTER:-*Hadamard*:CudaQ*:CudaFused*}" > /tmp/tests.log 2>&1
echo "tests rc $?" | tee -a "$OUT/log"
cp /tmp/tests.log "$OUT/tests.log"
grep -E "^\[  FAILED|^\[  PASSED|Failure|tests ran|SKIPPED \]" /tmp/tests.log | head -30 | tee -a "$OUT/log"
# The rotated-layer tests once more with the fusion on by default (the two measured calls ran
# the first pass with it on and this one with it off).
GYRE_CUDA_FUSED_ROTATION=1 timeout 60 /tmp/gt --gtest_filter='*Hadamard*' > /tmp/tests0.log 2>&1
echo "tests (fusion on) rc $?" | tee -a "$OUT/log"
grep -E "^\[  FAILED|^\[  PASSED|Failure" /tmp/tests0.log | head -10 | tee -a "$OUT/log"
bench() {  # bits mode
  local env=""
  case $2 in
    plain) env="GYRE_SYNTHETIC_HADAMARD=0" ;;
    old) env="GYRE_SYNTHETIC_HADAMARD=1 GYRE_CUDA_FUSED_ROTATION=0 GYRE_HADAMARD_WARP=0" ;;
    unf) env="GYRE_SYNTHETIC_HADAMARD=1 GYRE_CUDA_FUSED_ROTATION=0" ;;  # = the default now
    new) env="GYRE_SYNTHETIC_HADAMARD=1 GYRE_CUDA_FUSED_ROTATION=1" ;;
  esac
  echo "== $1-bit $2" >> "$OUT/log"
  env $env timeout 40 /tmp/gyre bench --synthetic llama3-8b --bits $1 -p 512 -n 128 --long 8192 2>&1 |
    grep -E "prefill|decode" | sed "s/^/$1b $2 /" | tee -a "$OUT/log"
}
R4='4:plain 4:old 4:unf 4:new'; R3='3:plain 3:old 3:unf 3:new'; R6='6:plain 6:old 6:unf 6:new'
for spec in ${BENCH:-$R4 $R4 $R4 $R3 $R3 $R6 $R6}; do
  bench ${spec%%:*} ${spec##*:}
done
