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

// Where a block writes its query heads' outputs: `row` (the query's output row at the block's
// first head; heads of D values in order), or, for a reader that takes the row in its own column
// order (an act-order o_proj: AttentionArgs::out_index, the weight's inv_perm), value j of the
// block at full[index[col0 + j]] (full: the query's whole row, col0: the block's first column).
struct OutRow {
  half* row = nullptr;
  const int32_t* index = nullptr;
  half* full = nullptr;
  int col0 = 0;
  __host__ __device__ OutRow(half* r) : row(r) {}  // NOLINT(google-explicit-constructor)
  __host__ __device__ OutRow(half* r, const int32_t* idx, half* f, int c0)
      : row(r), index(idx), full(f), col0(c0) {}
  __device__ __forceinline__ void put(int j, float v) const {
    if (index != nullptr)
      full[__ldg(index + col0 + j)] = __float2half(v);
    else
      row[j] = __float2half(v);
  }
  // Values j and j + 1 (j even, D even: 4-byte aligned in the natural order).
  __device__ __forceinline__ void put2(int j, float a, float b) const {
    if (index != nullptr) {
      put(j, a);
      put(j + 1, b);
    } else {
      *reinterpret_cast<half2*>(row + j) = __floats2half2_rn(a, b);
    }
  }
};

// Smallest share of the context per split. Measured (ncu, H100, Llama-3-8B shape, 130 keys):
// with 128-key shares one block did all the work of a decode step at short context, 58 us per
// layer; smaller shares spread short contexts over several blocks.
constexpr int kMinChunk = 32;
constexpr int kMaxSplits = 128;

// How a block of a split launch shares and combines (AttentionArgs / PagedAttentionArgs fields).
// trigger_span: PDL (launch.h) lets the next kernel in at the block's start for contexts of at
// most this many keys, else only after the block has read its keys. Measured (H100, 4-bit
// Llama-3-8B decode, bench/NOTES.md "attn1"): with the combine in this kernel the next kernel is
// the Wo GEMV, whose weight prefetch runs before its PDL wait; let in at the start, at 8k keys it
// competed with the attention's reads (decode 327.6 -> 319.1 tok/s against the separate combine
// kernel, which lets the GEMV in only once the attention is done), while at 128 keys the overlap
// helps.
// Shares from which the last block merges by weights (weighted_merge) instead of online.
constexpr int kWeightedMerge = 16;

struct Combine {
  unsigned* counter;  // this block's (row, head group) counter; null: the combine kernel
  int single_span;    // contexts of at most this many keys take one share
  int trigger_span;
  int min_chunk = kMinChunk;           // the smallest share
  int weighted_from = kWeightedMerge;  // more shares than this: weighted_merge
};

// Lets the next kernel launch (PDL) at the block's start (after pdl_wait) for spans of at most
// trigger_span keys; returns whether it was done (else the caller does it after its keys).
__device__ __forceinline__ bool early_trigger(int span, const Combine& c) {
  const bool early = span <= c.trigger_span;
  if (early) pdl_launch_dependents();
  return early;
}

struct Share {
  int lo, hi;  // this block's keys
  int shares;  // partial results to combine; 1: the block with keys writes the output itself
  bool idle;   // no keys and nothing to write: the block may return at once
};

// Share `split` of keys [lo, hi) (hi > lo) among `splits` blocks. combine_in_kernel: counters
// are used (else every block writes a partial); single_span: contexts this short take one share.
__device__ __forceinline__ Share share_of(int lo, int hi, int split, int splits,
                                          bool combine_in_kernel, int single_span,
                                          int min_chunk = kMinChunk) {
  const int span = max(1, hi - lo);
  int chunk = span;
  if (splits > 1 && !(combine_in_kernel && span <= single_span))
    chunk = max((span + splits - 1) / splits, min_chunk);
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
// The tail is latency (measured, H100, llama3-8b shape: ~3 us for 4 partials with a
// __threadfence per thread, shared split weights and a second pass), so: one release/acquire
// ticket by thread 0 after the block barrier (the barrier orders the block's partial stores
// before it, as CUTLASS's block barriers do), then one pass over the splits per output with an
// online merge (each split's m, l and acc loaded together, 2 outputs per thread, 8 splits per
// round in flight; 16 took the kernels' registers past the attention loop's). Not inlined:
// inlined, it moved ptxas's register choices for the attention loop before it (one FP16 head of
// the decode block 96 -> 108 registers, 5 -> 4 resident blocks; one q4 head 128 -> 227).
// Many shares (long contexts: 49 per head group for Llama-3-8B at 8k keys): the online merge's
// per-split m and l loads would take most of the last block's round trips, so first one round of
// them for every (head, share), their weights e^(m_s - M) / L in shared memory, then only the
// accumulators, 16 splits in flight per output (the registers of 8 in the online merge). Only in
// the decode blocks of >= 4 query heads (WEIGHTED): the one-head blocks' attention loop needs
// fewer registers, and the merge's would lower their occupancy (FP16: 96 -> 110 registers).
// H100, 4-bit Llama-3-8B decode at 8k: see bench/NOTES.md "Session 13".
constexpr int kMaxMergeHeads = 8;  // a block's query heads (attention_split.cuh: kMaxGroup)

static __device__ __forceinline__ void weighted_merge(const float* part, OutRow orow, int D, int gn,
                                                      int splits, int shares) {
  __shared__ float wn[kMaxMergeHeads][kMaxSplits];
  const int stride = D + 2;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  constexpr int kPerLane = kMaxSplits / 32;
  for (int g = warp; g < gn; g += warps) {
    const float* hp = part + static_cast<int64_t>(g) * splits * stride;
    float m[kPerLane], ls[kPerLane], mx = -FLT_MAX;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int sh = lane + 32 * k;
      m[k] = sh < shares ? __ldcg(hp + sh * stride + D) : -FLT_MAX;
      ls[k] = sh < shares ? __ldcg(hp + sh * stride + D + 1) : 0.0f;
      mx = fmaxf(mx, m[k]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float w[kPerLane], sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      w[k] = lane + 32 * k < shares ? __expf(m[k] - mx) : 0.0f;
      sum += ls[k] * w[k];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k)
      if (lane + 32 * k < shares) wn[g][lane + 32 * k] = w[k] * inv;
  }
  __syncthreads();
  const int width = (D & 1) == 0 ? 2 : 1;
  const int per_head = D / width, total = gn * per_head;
  constexpr int kOut = 2;
  for (int i0 = threadIdx.x; i0 < total; i0 += kOut * blockDim.x) {
    const float* head[kOut];
    int dim[kOut], g[kOut];
    float ax[kOut], ay[kOut];
#pragma unroll
    for (int o = 0; o < kOut; ++o) {
      const int i = min(i0 + o * static_cast<int>(blockDim.x), total - 1);
      g[o] = i / per_head;
      head[o] = part + static_cast<int64_t>(g[o]) * splits * stride;
      dim[o] = width * (i % per_head);
      ax[o] = ay[o] = 0.0f;
    }
#pragma unroll 16
    for (int sh = 0; sh < shares; ++sh) {
#pragma unroll
      for (int o = 0; o < kOut; ++o) {
        const float* ps = head[o] + sh * stride;
        const float2 v = width == 2 ? __ldcg(reinterpret_cast<const float2*>(ps + dim[o]))
                                    : make_float2(__ldcg(ps + dim[o]), 0.0f);
        const float wt = wn[g[o]][sh];
        ax[o] += v.x * wt;
        ay[o] += v.y * wt;
      }
    }
#pragma unroll
    for (int o = 0; o < kOut; ++o) {
      const int i = i0 + o * static_cast<int>(blockDim.x);
      if (i >= total) break;
      const int d = dim[o];
      if (width == 2)
        orow.put2(g[o] * D + d, ax[o], ay[o]);
      else
        orow.put(g[o] * D + d, ax[o]);
    }
  }
}

template <bool WEIGHTED = false>
static __device__ __noinline__ void combine_if_last(const float* part, OutRow orow,
                                                    unsigned* counter, int D, int gn, int splits,
                                                    int shares, int weighted_from) {
  __shared__ bool last_s;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned ticket;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;"
                 : "=r"(ticket)
                 : "l"(counter)
                 : "memory");
    const bool last = ticket == static_cast<unsigned>(shares - 1);
    if (last) *counter = 0;  // every other block of this launch has counted
    last_s = last;
  }
  __syncthreads();
  if (!last_s) return;
  if constexpr (WEIGHTED) {
    if (shares > weighted_from && shares <= kMaxSplits && gn <= kMaxMergeHeads) {
      weighted_merge(part, orow, D, gn, splits, shares);
      return;
    }
  }
  const int stride = D + 2;
  // Dim pairs (8-byte loads: the stride is even) when D is even.
  const int width = (D & 1) == 0 ? 2 : 1;
  const int per_head = D / width, total = gn * per_head;
  constexpr int kOut = 2;
  for (int i0 = threadIdx.x; i0 < total; i0 += kOut * blockDim.x) {
    const float* head[kOut];  // the head's partial of split 0
    int dim[kOut];
    float mx[kOut], l[kOut], ax[kOut], ay[kOut];
#pragma unroll
    for (int o = 0; o < kOut; ++o) {
      const int i = min(i0 + o * static_cast<int>(blockDim.x), total - 1);
      head[o] = part + static_cast<int64_t>(i / per_head) * splits * stride;
      dim[o] = width * (i % per_head);
      mx[o] = -FLT_MAX;
      l[o] = ax[o] = ay[o] = 0.0f;
    }
#pragma unroll 8
    for (int s = 0; s < shares; ++s) {
#pragma unroll
      for (int o = 0; o < kOut; ++o) {
        const float* ps = head[o] + s * stride;
        const float m = __ldcg(ps + D), ls = __ldcg(ps + D + 1);
        const float2 v = width == 2 ? __ldcg(reinterpret_cast<const float2*>(ps + dim[o]))
                                    : make_float2(__ldcg(ps + dim[o]), 0.0f);
        const float m_new = fmaxf(mx[o], m);
        const float keep = __expf(mx[o] - m_new), w = __expf(m - m_new);
        mx[o] = m_new;
        l[o] = l[o] * keep + ls * w;
        ax[o] = ax[o] * keep + v.x * w;
        ay[o] = ay[o] * keep + v.y * w;
      }
    }
#pragma unroll
    for (int o = 0; o < kOut; ++o) {
      const int i = i0 + o * static_cast<int>(blockDim.x);
      if (i >= total) break;
      const int g = i / per_head, d = dim[o];
      const float inv = l[o] > 0.0f ? 1.0f / l[o] : 0.0f;
      if (width == 2)
        orow.put2(g * D + d, ax[o] * inv, ay[o] * inv);
      else
        orow.put(g * D + d, ax[o] * inv);
    }
  }
}

}  // namespace gyre::cuda::split_share
