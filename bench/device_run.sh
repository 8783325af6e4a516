#!/usr/bin/env bash
# One call on a lent GPU machine that has the CUDA toolkit but none of Gyre's other build
# dependencies: gyre and gyre_tests are built here for sm_90 (scripts/build.sh
# -DGYRE_CUDA_ARCHS=90) and carried in .device/bin with the shared libraries the device image
# lacks; fixtures travel in .device/shared; a model larger than one transfer travels in two
# parts (/tmp/*.part1 left by a previous call, .device/*.part2). Then scripts/gpu_check.sh runs
# the CUDA tests and the benchmark table. Results land in $OUT.
set -u
root=$(pwd)
# The binaries look for the sources and fixtures where they were built.
if [ "$root" != /work/main ] && [ ! -e /work/main ]; then mkdir -p /work && ln -s "$root" /work/main; fi
[ -e /work/shared ] || ln -s "$root/.device/shared" /work/shared
if [ -f /tmp/smol.part1 ] && [ -f .device/smol.part2 ]; then
  mkdir -p models && cat /tmp/smol.part1 .device/smol.part2 >models/SmolLM2-135M-Instruct.Q4_1.gguf
fi
ls -la models 2>/dev/null
export LD_LIBRARY_PATH="$root/.device/bin:${LD_LIBRARY_PATH:-}"
scripts/gpu_check.sh .device/bin "${OUT:-bench/out}" 2>&1 | tee "${OUT:-bench/out}/gpu_check.log"
