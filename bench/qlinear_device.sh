#!/usr/bin/env bash
# Builds the quantized-linear GPU test and benchmark as self-contained binaries (static CUDA
# runtime and GoogleTest) into $1 (default build-qlinear), for running on a machine without the
# project's build dependencies. Usage: bench/qlinear_device.sh [outdir] [arch, default 90]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build-qlinear}
arch=${2:-90}
mkdir -p "$out"
# At most one nvcc per core at a time (a 2-core machine runs out of memory with all at once).
jobs_max=${GYRE_JOBS:-$(nproc)}
throttle() { while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done; }
flags=(-std=c++20 -O3 -arch=sm_"$arch" -Isrc -DGYRE_HAVE_CUDA=1 --expt-relaxed-constexpr
       -Xcompiler=-Wall,-Wextra,-Werror --Werror all-warnings -lineinfo -cudart static)
core=(src/backend/cpu/qlinear_ref.cc src/core/dtype.cc src/core/tensor.cc
      src/core/quant_blocks.cc src/backend/cpu/hadamard.cc src/backend/cpu/trellis.cc
      src/backend/cpu/trellis_layout.cc)
cuda=(src/backend/cuda/qlinear.cu src/backend/cuda/qlinear_gemm.cu src/backend/cuda/qlinear_tiled.cu
      src/backend/cuda/qlinear_batch.cu src/backend/cuda/qlinear_batch4.cu
src/backend/cuda/qlinear_batch_bulk.cu src/backend/cuda/qlinear_batch_stream.cu
      src/backend/cuda/qlinear_bits.cu src/backend/cuda/qlinear_bits_stream.cu
      src/backend/cuda/qlinear_gemv_stream.cu src/backend/cuda/qlinear_trellis.cu
      src/backend/cuda/elementwise.cu)
for f in "${core[@]}" "${cuda[@]}"; do
  throttle
  nvcc "${flags[@]}" -c "$f" -o "$out/$(basename "$f").o" &
done
wait
mkdir -p "$out/main"
throttle; nvcc "${flags[@]}" -x cu -c bench/qlinear_bench.cu -o "$out/main/bench.o" &
throttle; nvcc "${flags[@]}" -x cu -c tests/test_cuda_qlinear.cc -o "$out/main/tests.o" &
throttle; nvcc "${flags[@]}" -x cu -c bench/gemv4_bench.cu -o "$out/main/gemv4_bench.o" &
throttle; nvcc "${flags[@]}" -x cu -c tests/test_cuda_gemv4.cc -o "$out/main/tests_gemv4.o" &
throttle; nvcc "${flags[@]}" -x cu -c bench/qlinear_bits_bench.cu -o "$out/main/bits_bench.o" &
throttle; nvcc "${flags[@]}" -x cu -c tests/test_cuda_qbits.cc -o "$out/main/bits_tests.o" &
throttle; nvcc "${flags[@]}" -x cu -c tests/test_cuda_qbits_layout.cc -o "$out/main/bits_layout_tests.o" &
throttle; nvcc "${flags[@]}" -x cu -c tests/test_cuda_qlinear_bstream.cc -o "$out/main/tests_bstream.o" &
throttle; nvcc "${flags[@]}" -x cu -c bench/qlinear_trellis_bench.cu -o "$out/main/trellis_bench.o" &
wait
nvcc "${flags[@]}" "$out/main/bench.o" "$out"/*.o -o "$out/qlinear_bench"
nvcc "${flags[@]}" "$out/main/gemv4_bench.o" "$out"/*.o -o "$out/gemv4_bench"
nvcc "${flags[@]}" "$out/main/bits_bench.o" "$out"/*.o -o "$out/qlinear_bits_bench"
nvcc "${flags[@]}" "$out/main/trellis_bench.o" "$out"/*.o -o "$out/qlinear_trellis_bench"
nvcc "${flags[@]}" "$out/main/tests.o" "$out/main/tests_gemv4.o" "$out/main/bits_tests.o" \
  "$out/main/bits_layout_tests.o" "$out/main/tests_bstream.o" \
  "$out"/*.o -lgtest -lgtest_main -lpthread -o "$out/qlinear_tests"
