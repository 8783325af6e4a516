// How the split (flash-decoding) attention blocks (attention_split.cuh, attention_decode.cuh;
// contiguous and paged caches) share one row's keys, and how their partial results become the
// output without a second kernel.
// A launch has a fixed split count (shapes only, so a captured CUDA graph replays at any
// position); the keys [lo, hi) are known on the device only. Shares are at least kMinChunk keys,
// so a short context uses few of the blocks; the others return at once.
// Combining: with a counter per (row, head group) (AttentionArgs::counters), each block that has
// keys writes its partial (acc, m, l per head), and the last of them to finish (atomic ticket
// after a __threadfence) reads all of them back from L2 and writes the normalised output, then
// resets the counter for the next launch. That replaces split_combine_kernel's launch (ncu, H100,
// 4-bit Llama-3-8B decode at ~100 keys: attention 7.4 us + combine 5.6 us per layer). Contexts of
// at most single_span keys take one share: the block writes the output directly (no partial).
// Without counters every block writes a partial (empty shares a neutral one) for the combine
// kernel (split_combine in attention_split.cuh), the old path kept for A/B measurements.
#pragma once
#include <cfloat>

#include "backend/cuda/launch.h"

namespace gyre::cuda::split_share {

// Smallest share of the context per split. Measured (ncu, H100, Llama-3-8B shape, 130 keys):
// with 128-key shares one block did all the work of a decode step at short context, 58 us per
// layer; smaller shares spread short contexts over several blocks.
constexpr int kMinChunk = 32;
constexpr int kMaxSplits = 128;

struct Share {
  int lo, hi;  // this block's keys
  int shares;  // partial results to combine; 1: the block with keys writes the output itself
  bool idle;   // no keys and nothing to write: the block may return at once
};

// Share `split` of keys [lo, hi) (hi > lo) among `splits` blocks. combine_in_kernel: counters
// are used (else every block writes a partial); single_span: contexts this short take one share.
__device__ __forceinline__ Share share_of(int lo, int hi, int split, int splits,
                                          bool combine_in_kernel, int single_span) {
  const int span = max(1, hi - lo);
  int chunk = span;
  if (splits > 1 && !(combine_in_kernel && span <= single_span))
    chunk = max((span + splits - 1) / splits, kMinChunk);
  Share s;
  s.lo = min(hi, lo + split * chunk);
  s.hi = min(hi, s.lo + chunk);
  s.shares = combine_in_kernel || splits == 1 ? (span + chunk - 1) / chunk : splits;
  s.idle = split >= s.shares;
  return s;
}

// Called by every thread of a block after its partial is written (part: the partials of the
// block's first head, (D + 2) floats per (head, split): acc[D], m, l; heads `splits` apart).
// The last of the `shares` blocks of the counter's (row, head group) combines them into orow
// (gn heads of D dims): out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M), M = max m_s.
// G: the most heads a block holds (static shared memory for the split weights). Not inlined:
// inlined, it moved ptxas's register choices for the attention loop before it (one FP16 head of
// the decode block 96 -> 108 registers, 5 -> 4 resident blocks; one q4 head 128 -> 227).
template <int G>
__device__ __noinline__ void combine_if_last(const float* part, half* orow, unsigned* counter,
                                             int D, int gn, int splits, int shares) {
  __shared__ float weight_s[G][kMaxSplits];
  __shared__ float inv_l_s[G];
  __shared__ bool last_s;
  __threadfence();  // this block's partial is visible before its ticket
  __syncthreads();
  if (threadIdx.x == 0) {
    const bool last = atomicAdd(counter, 1u) == static_cast<unsigned>(shares - 1);
    if (last) atomicExch(counter, 0u);  // every other block of this launch has counted
    last_s = last;
  }
  __syncthreads();
  if (!last_s) return;
  __threadfence();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int stride = D + 2;
  for (int g = warp; g < gn; g += warps) {
    const float* pg = part + static_cast<int64_t>(g) * splits * stride;
    float mx = -FLT_MAX;
    for (int s = lane; s < shares; s += 32) mx = fmaxf(mx, __ldcg(pg + s * stride + D));
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float l = 0.0f;
    for (int s = lane; s < shares; s += 32) {
      const float w = __expf(__ldcg(pg + s * stride + D) - mx);
      weight_s[g][s] = w;
      l += __ldcg(pg + s * stride + D + 1) * w;
    }
    for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
    if (lane == 0) inv_l_s[g] = l > 0.0f ? 1.0f / l : 0.0f;
  }
  __syncthreads();
  // Dim pairs (8-byte loads: stride is even) when D is even; 8 splits per round in flight.
  const int width = (D & 1) == 0 ? 2 : 1;
  const int per_head = D / width;
  for (int i = threadIdx.x; i < gn * per_head; i += blockDim.x) {
    const int g = i / per_head, d = width * (i % per_head);
    const float* pg = part + static_cast<int64_t>(g) * splits * stride + d;
    float ax = 0.0f, ay = 0.0f;
    if (width == 2) {
#pragma unroll 8
      for (int s = 0; s < shares; ++s) {
        const float2 v = __ldcg(reinterpret_cast<const float2*>(pg + s * stride));
        ax += v.x * weight_s[g][s];
        ay += v.y * weight_s[g][s];
      }
      const float inv = inv_l_s[g];
      *reinterpret_cast<half2*>(orow + g * D + d) = __floats2half2_rn(ax * inv, ay * inv);
    } else {
#pragma unroll 8
      for (int s = 0; s < shares; ++s) ax += __ldcg(pg + s * stride) * weight_s[g][s];
      orow[g * D + d] = __float2half(ax * inv_l_s[g]);
    }
  }
}

}  // namespace gyre::cuda::split_share
