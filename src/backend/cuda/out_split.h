// Where a GEMV/GEMM writes output row `row` of token `tok`: one [n, rows] tensor, or (fused
// projections such as Q|K|V) up to three tensors, each taking a contiguous range of the weight's
// rows as its own [n, width] tensor. Shared by gemv.cu and the qlinear kernels so that one pass
// over a fused weight fills every output without a copy kernel.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace gyre::cuda {

struct OutSplit {
  static constexpr int kMaxParts = 3;
  __half* out[kMaxParts] = {nullptr, nullptr, nullptr};
  int end[kMaxParts] = {0, 0, 0};  // exclusive row ends, increasing; end[parts - 1] = rows
  int parts = 0;                   // 0: not split (the caller's plain output)

  static OutSplit plain(__half* y, int rows) {
    OutSplit s;
    s.out[0] = y;
    s.end[0] = rows;
    s.parts = 1;
    return s;
  }
};

#ifdef __CUDACC__
__device__ __forceinline__ void split_store(const OutSplit& s, int tok, int row, float v) {
  int part = 0, start = 0;
  for (int i = 1; i < OutSplit::kMaxParts; ++i) {
    if (i < s.parts && row >= s.end[i - 1]) {
      part = i;
      start = s.end[i - 1];
    }
  }
  const int width = s.end[part] - start;
  s.out[part][int64_t{tok} * width + (row - start)] = __float2half_rn(v);
}
#endif

// Gate/up weights fused for SwiGLU are interleaved in blocks of kSwigluBlock rows: fused rows
// [16b, 16b + 8) are gate rows [8b, 8b + 8) and [16b + 8, 16b + 16) the matching up rows (the
// hidden size padded to a multiple of 8 with zero rows). A 16-row tensor-core tile then holds a
// gate row and its up row in the same thread (rows g and g + 8), and an 8-warp GEMV block all
// pairs of its 8 hidden rows.
constexpr int kSwigluBlock = 8;
// Trellis-coded gate/up weights interleave in blocks of whole 16-row tiles (a tile is coded as
// one sequence and cannot be split): their SwiGLU runs as its own kernel after the matmul.
constexpr int kTrellisSwigluBlock = 16;

#ifdef __CUDACC__
__device__ __forceinline__ float silu_times(float gate, float up) {
  return gate / (1.0f + __expf(-gate)) * up;
}
#endif

}  // namespace gyre::cuda
