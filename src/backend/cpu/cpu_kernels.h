// Inner loops of the CPU backend, written so the compiler vectorizes them (-O3 -march=x86-64-v3):
// contiguous rows, fixed-width lane accumulators, no aliasing between inputs and outputs.
//
// Every dot product here sums in the same order (8 lanes over the whole 8-element blocks, a fixed
// reduction of the lanes, then the tail), whichever kernel shape computes it, so a matmul gives
// bit-identical results for a token whether it runs alone or in a batch.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.h"

namespace gyre {

// Per-thread scratch of at least n floats (scores, rotated rows); reused across calls, so a
// caller must not hold it across another call that uses it.
inline std::vector<float>& thread_buffer(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf;
}

// A second per-thread scratch of at least n floats (one dequantized KV cache row), independent of
// thread_buffer so both can be held at once.
inline float* kv_row_scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// Uninitialized memory aligned for vector loads, freed with the last owner.
std::shared_ptr<void> alloc_aligned(size_t bytes);

// n elements of a row of type t (F32, F16 or BF16; src needs only the element's alignment) to f32.
void convert_row_to_f32(DType t, const void* src, float* dst, int64_t n);

float dot_f32(const float* a, const float* b, int64_t n);

// out[t * out_stride + o] = x[t, :] . w[o, :] for t in [0, n_tokens), o in [o_begin, o_end).
// w is [rows, cols] of type w_type (F32, F16 or BF16); x is [n_tokens, cols] f32.
void matmul_rows(float* out, int64_t out_stride, const float* x, int64_t n_tokens, const void* w,
                 DType w_type, int64_t cols, int64_t o_begin, int64_t o_end);

}  // namespace gyre
