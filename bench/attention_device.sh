#!/usr/bin/env bash
# Builds the decode attention check + bench (bench/attention_device.cu) as one self-contained
# binary (static CUDA runtime) into $1 (default build-attention), for a device machine without
# the project's build dependencies. Usage: bench/attention_device.sh [outdir] [arch, default 90]
# Run: OUTDIR/attention_device [check|bench|all]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build-attention}
arch=${2:-90}
mkdir -p "$out"
flags=(-std=c++20 -O3 -arch=sm_"$arch" -Isrc -DGYRE_HAVE_CUDA=1 --expt-relaxed-constexpr
       -Xcompiler=-Wall,-Wextra,-Werror --Werror all-warnings -lineinfo -cudart static)
srcs=(src/backend/cuda/attention.cu src/backend/cuda/paged_attention.cu
      src/backend/cuda/elementwise.cu src/core/kv_quant.cc bench/attention_device.cu)
pids=()
for f in "${srcs[@]}"; do
  nvcc "${flags[@]}" -x cu -c "$f" -o "$out/$(basename "$f").o" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
nvcc "${flags[@]}" "$out"/*.o -o "$out/attention_device"
