// The CUDA side of rotated linear layers (backend/cpu/hadamard.h): the input x of such a layer is
// rotated, R^T x = blockwise H_B (s .* x), into a scratch buffer before the ordinary qlinear call,
// except where the decode GEMV rotates x in its own staging (qlinear_fuses_rotation, qlinear.h;
// qlinear_stream.cuh; off by default). Measured in bench/qlinear_notes.md, "Session 8: fused
// rotation".
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace gyre::cuda {

// Largest block hadamard_rotate handles (one thread per element of a block).
constexpr int kHadamardMaxBlock = 1024;

// out [n, cols] = each row's B-blocks of (signs .* x) through the orthonormal fast
// Walsh-Hadamard transform (f32 inside, rounded to f16 once). x and out are contiguous row-major
// FP16 and may not overlap; block is a power of two <= kHadamardMaxBlock dividing cols; signs
// [cols] of +-1 on the device.
void hadamard_rotate(half* out, const half* x, const int8_t* signs, int64_t n, int cols, int block,
                     cudaStream_t s);

}  // namespace gyre::cuda
