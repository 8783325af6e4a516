// Rotary embedding of q and k fused with the KV-cache store, the body shared by the paged cache's
// kernel (paged_rope_store.cu) and the contiguous cache's (attention.cu): one launch per layer
// instead of two (rope, then the store), and k is read once (rotated in registers on its way to
// the cache, never written back).
// Grid (row, group of kRopeStoreWarps heads); warp w of a block takes one head of the row: q heads
// first (rotated in place, one thread per pair as in rope.cu), then k heads, then v heads. A k or
// v head is staged in shared memory (rotated, rounded to FP16 as rope.cu would store it) and then
// written one 32-dim block at a time with lane = dim, which is the layout the q8/q4 quantizer
// (kv_quantize_block) reduces over, so FP16 and quantized caches share one body.
// cos/sin of the row's pairs are computed once per block (in f32 with full-range sincosf, scaled
// by attn_factor, exactly as rope.cu does) and shared by its heads.
#pragma once
#include "backend/cuda/kv_quant.cuh"
#include "backend/cuda/launch.h"

namespace gyre::cuda {

constexpr int kRopeStoreThreads = 128;
constexpr int kRopeStoreWarps = kRopeStoreThreads / 32;

// Blocks along y for a row's q, k and v heads.
inline unsigned rope_store_head_groups(const RopeStoreArgs& a) {
  const int heads = a.n_heads + 2 * a.store.n_kv_heads;
  return static_cast<unsigned>((heads + kRopeStoreWarps - 1) / kRopeStoreWarps);
}

inline void check_rope_store(const RopeStoreArgs& a) {
  const int D = a.store.head_dim;
  GYRE_CHECK(D > 0 && D <= kRopeStoreMaxHeadDim, "CUDA rope/store supports head_dim up to ",
             kRopeStoreMaxHeadDim, ", got ", D);
  GYRE_CHECK(a.rot_dim > 0 && a.rot_dim <= D && a.rot_dim % 2 == 0,
             "CUDA rope/store: bad rotary dims ", a.rot_dim, " of ", D);
}

// Dims of pair i: (2i, 2i+1) when interleaved, else (i, i + half_rot).
__device__ __forceinline__ int2 rope_pair_dims(int i, int half_rot, bool interleaved) {
  return interleaved ? make_int2(2 * i, 2 * i + 1) : make_int2(i, i + half_rot);
}

// cos/sin of the pairs at `position` (f32, full-range sincosf, times attn_factor), thread tid of
// nthreads; the caller syncs before reading them.
__device__ __forceinline__ void rope_cos_sin(const RopeStoreArgs& a, int position, float* cos_s,
                                             float* sin_s, int tid, int nthreads) {
  const float pos = static_cast<float>(position);
  for (int i = tid; i < a.rot_dim / 2; i += nthreads) {
    float sn, cs;
    sincosf(pos * a.inv_freq[i], &sn, &cs);
    cos_s[i] = cs * a.attn_factor;
    sin_s[i] = sn * a.attn_factor;
  }
}

// One head's rotated pairs from src to dst (the same pointer: in place; each pair is read and
// written by one thread), rounded to FP16; copy_rest: dims past rot_dim are copied too.
__device__ __forceinline__ void rope_head(const RopeStoreArgs& a, const half* src, half* dst,
                                          const float* cos_s, const float* sin_s, int lane,
                                          bool copy_rest) {
  const int half_rot = a.rot_dim / 2;
  for (int i = lane; i < half_rot; i += 32) {
    const int2 d = rope_pair_dims(i, half_rot, a.interleaved);
    const float x0 = __half2float(src[d.x]), x1 = __half2float(src[d.y]);
    dst[d.x] = __float2half(x0 * cos_s[i] - x1 * sin_s[i]);
    dst[d.y] = __float2half(x0 * sin_s[i] + x1 * cos_s[i]);
  }
  if (copy_rest)
    for (int d = a.rot_dim + lane; d < a.store.head_dim; d += 32) dst[d] = src[d];
}

// A staged FP16 row buf [head_dim] into cache row crow of the key (kv 0) or value (kv 1) plane,
// quantized for q8/q4 (one warp; warp-uniform).
template <int T>
__device__ __forceinline__ void store_staged_row(const KvStoreArgs& st, int kv, const half* buf,
                                                 int64_t crow, int lane) {
  const int D = st.head_dim;
  uint8_t* codes =
      static_cast<uint8_t*>(kv ? st.v_codes : st.k_codes) + crow * kv_code_bytes_of<T>(D);
  for (int b0 = 0; b0 < D; b0 += 32) {  // warp-uniform trip count (the quantizer shuffles)
    const int d = b0 + lane;
    const bool active = d < D;
    if constexpr (T == kKvF16) {
      if (active) reinterpret_cast<half*>(codes)[d] = buf[d];
    } else {
      half* params = (kv ? st.v_params : st.k_params) + crow * kv_param_halves_of<T>(D);
      kv_quantize_block<T>(active ? __half2float(buf[d]) : 0.0f, active, b0, codes, params);
    }
  }
}

// Key head (kv 0: rotated) or value head (kv 1) h of row `row` into cache row crow, through the
// warp's staging buffer buf [head_dim] (one warp; warp-uniform).
template <int T>
__device__ __forceinline__ void store_kv_head(const RopeStoreArgs& a, int row, int kv, int h,
                                              const float* cos_s, const float* sin_s, half* buf,
                                              int64_t crow, int lane) {
  const int D = a.store.head_dim;
  const half* src = (kv ? a.v : a.k) + (static_cast<int64_t>(row) * a.store.n_kv_heads + h) * D;
  if (!kv) rope_head(a, src, buf, cos_s, sin_s, lane, true);
  if (kv)  // values go as they are
    for (int d = lane; d < D; d += 32) buf[d] = src[d];
  __syncwarp();
  store_staged_row<T>(a.store, kv, buf, crow, lane);
}

// The block's share of row `row` at position `position`; cache_row(h) is the cache row of KV
// head h for this row. Called after pdl_begin by all kRopeStoreThreads threads.
template <int T, class CacheRow>
__device__ __forceinline__ void rope_store_row(const RopeStoreArgs& a, int row, int position,
                                               const CacheRow& cache_row) {
  constexpr int kMaxPairs = kRopeStoreMaxHeadDim / 2;
  __shared__ float cos_s[kMaxPairs], sin_s[kMaxPairs];
  __shared__ half staged[kRopeStoreWarps][kRopeStoreMaxHeadDim];
  const int D = a.store.head_dim, n_kv = a.store.n_kv_heads;
  rope_cos_sin(a, position, cos_s, sin_s, threadIdx.x, kRopeStoreThreads);
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int head = blockIdx.y * kRopeStoreWarps + warp;
  if (head >= a.n_heads + 2 * n_kv) return;  // no block-wide barrier follows

  if (head < a.n_heads) {  // q: in place
    half* x = a.q + (static_cast<int64_t>(row) * a.n_heads + head) * D;
    rope_head(a, x, x, cos_s, sin_s, lane, false);
    return;
  }
  const int kv = head >= a.n_heads + n_kv ? 1 : 0;  // 0: a key head, 1: a value head
  const int h = head - a.n_heads - kv * n_kv;
  store_kv_head<T>(a, row, kv, h, cos_s, sin_s, staged[warp], cache_row(h), lane);
}

}  // namespace gyre::cuda
