#!/usr/bin/env bash
# One device call for the sampling op (branch `sampling`): its CUDA tests (default kernel mode,
# then the other implementation modes of sampling.h), the forward tests it touches, the op's
# timing (1 and 32 rows of 128256 logits, vs rows to the host + host sampling) per mode, and
# `gyre bench` decode with the greedy pick on the GPU (GYRE_CUDA_SAMPLE=1) and through the host
# (=0, the old path), alternated twice to see the noise.
# Run from /work/main with .device/{libs,shared,sampling} carried; writes $OUT/log.
set -u
D=.device/sampling
export LD_LIBRARY_PATH=$PWD/.device/libs
mkdir -p /work/wt/sampling && ln -sfn "$PWD/tests" /work/wt/sampling/tests &&
  ln -sfn "$PWD/.device/shared" /work/wt/shared
log=$OUT/log
full=$OUT/full.log
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$log"
timeout 90 $D/gyre_tests --gtest_filter='SamplingOp*:CudaForward*:CudaFused*' >"$full" 2>&1
grep -E "^\[  *(OK|FAILED) |compared|PASSED" "$full" | sort -u | tee -a "$log"
grep -A4 Failure "$full" | head -24 | tee -a "$log"
for mode in 0 1 2; do
  echo "mode $mode tests:" | tee -a "$log"
  GYRE_CUDA_SAMPLE_MODE=$mode timeout 60 $D/gyre_tests --gtest_filter='SamplingOpCuda*' 2>&1 |
    grep -E "compared|PASSED|FAILED  \]|Failure" | sort | uniq -c | head -8 | tee -a "$log"
done
for mode in 0 1 2 3; do
  echo "mode $mode timing:" | tee -a "$log"
  GYRE_CUDA_SAMPLE_MODE=$mode timeout 60 $D/gyre_tests --gtest_filter='SamplingOpCuda.DISABLED_Timing' \
    --gtest_also_run_disabled_tests 2>&1 | grep -E "sample op|FAIL" | tee -a "$log"
done
for mode in 0 1 0 1; do
  echo "bench GYRE_CUDA_SAMPLE=$mode" | tee -a "$log"
  GYRE_CUDA_SAMPLE=$mode timeout 60 $D/gyre bench --synthetic llama3-8b --bits 4 -p 512 --long 0 \
    2>&1 | grep -E "decode|error" | tee -a "$log"
done
