#!/bin/bash
# Device call 1 of the Hadamard work (helper had): the GPU tests, then decode tok/s of the
# synthetic Llama-3-8B shape at 4 bits without and with a random rotation on every weight
# (GYRE_SYNTHETIC_HADAMARD=1: the unfused rotate launch before each GEMV, and no norm fusion).
# Expects .device/had/{gyre,gyre_tests}.xz, .device/libs, .device/shared; writes to $OUT/log.
export LD_LIBRARY_PATH=$PWD/.device/libs
mkdir -p /work/wt/had && ln -sfn "$PWD/tests" /work/wt/had/tests && ln -sfn "$PWD/.device/shared" /work/wt/shared
xz -dc .device/had/gyre_tests.xz > /tmp/gt && chmod +x /tmp/gt
xz -dc .device/had/gyre.xz > /tmp/gyre && chmod +x /tmp/gyre
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv 2>&1 | tee -a "$OUT/log"
/tmp/gt --gtest_filter='Hadamard*:QMixedCuda*:CudaFused*:QuantFormatsCuda*:FusedWeights*' 2>&1 | tail -40 | tee -a "$OUT/log"
for had in 0 1 0 1; do
  echo "== bench GYRE_SYNTHETIC_HADAMARD=$had" | tee -a "$OUT/log"
  GYRE_SYNTHETIC_HADAMARD=$had timeout 60 /tmp/gyre bench --synthetic llama3-8b --bits 4 -p 512 -n 128 --long 0 2>&1 | tail -8 | tee -a "$OUT/log"
done
