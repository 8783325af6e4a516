// What the decode attention blocks (attention_decode.cuh: the scalar loop;
// attention_decode_mma.cuh: the tensor-core loop) share: shapes, the 8-dim row loads of every cache
// type, q's rotation (QRope) and the new row's rope + store inside the kernel, and the per-warp
// states the block merges at its end.
#pragma once
#include <cfloat>
#include <climits>
#include <cstdlib>
#include <string>

#include "backend/cuda/attention_share.cuh"
#include "backend/cuda/kv_quant.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/rope_store.cuh"

namespace gyre::cuda::decode_attn {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
// The tensor-core loop's blocks (attention_decode_mma.cuh): 8 warps, one block per SM.
constexpr int kMmaWarps = 8;
// Threads of a decode block.
constexpr int threads_of(bool mma) {
  return 32 * (mma ? kMmaWarps : kWarps);
}
constexpr int kMaxHeadDim = 128;

// Head dims this block handles: 8 dims per lane, 16-byte aligned rows.
inline bool supported(int head_dim) {
  return head_dim % 8 == 0 && head_dim <= kMaxHeadDim;
}
// ... and the query rows are 16-byte aligned (each lane loads its 8 dims of q at once).
inline bool usable(int head_dim, const half* q) {
  return supported(head_dim) && (reinterpret_cast<uintptr_t>(q) & 15) == 0;
}
// Lanes per row: 8 up to 64 dims, else 16.
inline int lanes_for(int head_dim) {
  return head_dim <= 64 ? 8 : 16;
}
// The query-head group template (<= 8 heads per block): the smallest of 1, 4, 8 that holds gn.
inline int group_for(int gn) {
  return gn <= 1 ? 1 : gn <= 4 ? 4 : 8;
}

// 8 dims of one row as loaded: codes and (q8/q4) their block's params (q8: scale in .x; q4:
// scale, min).
template <int T>
struct Dims8 {
  typename KvRaw8<T>::type raw;
  half2 par;
};

template <int T>
__device__ __forceinline__ void load_dims8(Dims8<T>& out, const void* codes, const half* params,
                                           int64_t row, int D, int d) {
  const KvRow r = kv_row<T>(codes, params, row, D);
  out.raw = kv_raw8<T>(r, d);
  if constexpr (T == kKvQ8)
    out.par = __halves2half2(r.params[d >> 5], r.params[d >> 5]);
  else if constexpr (T == kKvQ4)
    out.par = *reinterpret_cast<const half2*>(r.params + 2 * (d >> 5));
}

template <int T>
__device__ __forceinline__ void zero_dims8(Dims8<T>& out) {
  if constexpr (T == kKvF16)
    out.raw = make_uint4(0, 0, 0, 0);
  else if constexpr (T == kKvQ8)
    out.raw = make_uint2(0, 0);
  else
    out.raw = 0;
  out.par = __floats2half2_rn(0.0f, 0.0f);
}

// Same arithmetic as kv_decode8 (and the CPU's kv_dequantize_row).
template <int T>
__device__ __forceinline__ void decode_dims8(const Dims8<T>& in, float (&out)[8]) {
  if constexpr (T == kKvF16) {
    const half2* h2 = reinterpret_cast<const half2*>(&in.raw);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __half22float2(h2[e]);
      out[2 * e] = f.x;
      out[2 * e + 1] = f.y;
    }
  } else if constexpr (T == kKvQ8) {
    const float s = __low2float(in.par);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const uint32_t word = e < 4 ? in.raw.x : in.raw.y;
      out[e] = s * static_cast<float>(static_cast<int8_t>((word >> (8 * (e & 3))) & 0xFFu));
    }
  } else {
    const float s = __low2float(in.par), mn = __high2float(in.par);
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] = mn + s * static_cast<float>((in.raw >> (4 * e)) & 15u);
  }
}

// q rotated in registers as it is loaded (the contiguous cache's fused rope, attention.cu): cos and
// sin of the pairs in shared memory; rope.cu's f32 expressions, rounded to FP16 as it stores them.
// Neox pairs (i, i + half_rot) need half_rot % 8 == 0, so that a lane's 8 dims and their partners'
// lie on one side of half_rot (the partner is another lane of the row: one shuffle per value).
struct QRope {
  const float* cos;
  const float* sin;
  int half_rot, rot_dim;
  bool interleaved;
};

// A lane's rotation of its 8 dims: out[e] = x[e] c[e] + y[e] s[e], y the pair's other value
// (interleaved: x[e ^ 1] of the lane; neox: the same dim of lane `src`), s[e] signed; dims past
// rot_dim get c 1, s 0. Computed once per block, used for every head.
struct QRopeLane {
  float c[8], s[8];
  int src;
};

template <int L>
__device__ __forceinline__ QRopeLane rope_lane(const QRope& rq, int lane) {
  const int l = lane % L, d0 = 8 * l;
  const bool lower = d0 < rq.half_rot;
  QRopeLane r;
  int partner = l;
  if (!rq.interleaved && d0 < rq.rot_dim)
    partner = lower ? l + rq.half_rot / 8 : l - rq.half_rot / 8;
  r.src = lane - l + partner;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int d = d0 + e;
    const int i = rq.interleaved ? d / 2 : (lower ? d : d - rq.half_rot);
    const bool first = rq.interleaved ? (e & 1) == 0 : lower;  // (x0 of the pair)
    const bool rotated = d < rq.rot_dim;
    r.c[e] = rotated ? rq.cos[i] : 1.0f;
    r.s[e] = rotated ? (first ? -rq.sin[i] : rq.sin[i]) : 0.0f;
  }
  return r;
}

// Rotates x (the 8 dims at 8 l of one head; zeros on inactive lanes) and rounds to FP16 as rope.cu
// stores it. Every lane of the warp calls it (one shuffle per value).
__device__ __forceinline__ void rope_q8(const QRopeLane& r, bool interleaved, float (&x)[8]) {
  float y[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) y[e] = __shfl_sync(0xffffffffu, x[e], r.src);
  if (interleaved) {
#pragma unroll
    for (int e = 0; e < 8; ++e) y[e] = x[e ^ 1];
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) x[e] = __half2float(__float2half(x[e] * r.c[e] + y[e] * r.s[e]));
}

// rope_kv_store's work for a decode row inside the attention kernels that do it (contiguous
// cache: attention.cu; paged: paged_attention.cu), arranged for latency: cos/sin before the PDL
// wait (rope_tables: positions are staged by the host, the table is constant), q rotated as
// decode_attend loads it (QRope), and the new key (rotated) and value stored into the cache
// (RopePrologue: one round of 16-byte loads into shared memory, the rotation there, the store).
struct RopeSmem {
  float cos[kMaxHeadDim / 2], sin[kMaxHeadDim / 2];
  __align__(16) half kv[2][kMaxHeadDim];
};

// Key (rotated) and value of KV head kvh of row `row` of r.k / r.v into cache row crow.
template <int T>
__device__ __forceinline__ void store_new_row(const RopeStoreArgs& r, int row, int kvh,
                                              int64_t crow, RopeSmem& sm) {
  const int D = r.store.head_dim, chunks = D / 8;
  const int64_t src_row = static_cast<int64_t>(row) * r.store.n_kv_heads + kvh;
  for (int i = threadIdx.x; i < 2 * chunks; i += blockDim.x) {
    const int kv = i / chunks, c = i - kv * chunks;
    const half* src = (kv ? r.v : r.k) + src_row * D + 8 * c;
    *reinterpret_cast<uint4*>(sm.kv[kv] + 8 * c) = *reinterpret_cast<const uint4*>(src);
  }
  __syncthreads();
  const int half_rot = r.rot_dim / 2;
  for (int i = threadIdx.x; i < half_rot; i += blockDim.x) {
    const int2 d = rope_pair_dims(i, half_rot, r.interleaved);
    const float x0 = __half2float(sm.kv[0][d.x]), x1 = __half2float(sm.kv[0][d.y]);
    sm.kv[0][d.x] = __float2half(x0 * sm.cos[i] - x1 * sm.sin[i]);
    sm.kv[0][d.y] = __float2half(x0 * sm.sin[i] + x1 * sm.cos[i]);
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;  // key: warp 0, value: warp 1
  if (warp < 2) store_staged_row<T>(r.store, warp, sm.kv[warp], crow, lane);
  __syncthreads();
}

// cos/sin at `pos` into sm (every thread; constants and host-staged positions, so before the PDL
// wait); returns decode_attend's QRope.
__device__ __forceinline__ QRope rope_tables(const RopeStoreArgs& r, int pos, RopeSmem& sm) {
  rope_cos_sin(r, pos, sm.cos, sm.sin, threadIdx.x, blockDim.x);
  __syncthreads();
  return QRope{sm.cos, sm.sin, r.rot_dim / 2, r.rot_dim, r.interleaved};
}

// What a decode block does between its start and its key loop, in two parts the loop calls in
// order: wait() (the PDL wait: after it the previous kernel's q, k and v are visible) and store()
// (the new row into the cache). Keys below safe_hi are in the cache before wait(): a loop may load
// them first, so their latency overlaps the previous kernel's tail and the wait.
// NoPrologue: the kernel waited already and nothing is stored.
// GYRE_CUDA_ATTN_PRELOAD=0: no keys loaded before the prologue (a measurement knob; the kernels
// take it as an argument).
inline bool preload_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("GYRE_CUDA_ATTN_PRELOAD");
    return e == nullptr || std::string(e) != "0";
  }();
  return on;
}

struct NoPrologue {
  int safe_hi = INT_MAX;
  __device__ void wait() const {}
  __device__ void store() const {}
};

// The fused rope + KV store's part (rope_kv_store's work for a decode row): the new key (rotated)
// and value of KV head kvh of row `row` stored at cache row crow by the block whose share ends at
// the new key (`store_row`), before its own loop reads them. With two query-head groups per KV
// head both such blocks store the same bytes. The rows below the new key were written by earlier
// steps: safe_hi is the new key's index.
template <int T>
struct RopePrologue {
  const RopeStoreArgs& r;
  int row, kvh;
  int64_t crow;
  bool store_row;
  RopeSmem& sm;
  int safe_hi;
  __device__ void wait() const { pdl_wait(); }
  __device__ void store() const {
    if (store_row) store_new_row<T>(r, row, kvh, crow, sm);
  }
};

// Whether a decode kernel can do rope_kv_store's work for r on attention rows of head_dim with
// cache type kv_type (q and the source rows 16-byte aligned: each lane loads 8 dims at once;
// neox rotations need half_rot % 8 == 0, QRope).
inline bool rope_fusable(const RopeStoreArgs& r, int head_dim, int n_heads, int n_kv_heads,
                         int kv_type) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return supported(head_dim) && aligned(r.q) && aligned(r.k) && aligned(r.v) &&
         aligned(r.store.k_codes) && aligned(r.store.v_codes) && r.inv_freq != nullptr &&
         r.store.head_dim == head_dim && r.store.kv_type == kv_type &&
         r.store.n_kv_heads == n_kv_heads && r.n_heads == n_heads && r.rot_dim > 0 &&
         r.rot_dim <= head_dim && r.rot_dim % 2 == 0 && (r.interleaved || (r.rot_dim / 2) % 8 == 0);
}

// What each of a block's W warps leaves for the block's merge (finish_block): per query head, its
// unnormalised output over its keys (acc: D values), its running max m and its sum l.
template <int G, int L, int W = kWarps>
struct WarpStates {
  static constexpr int kWarpCount = W;
  float acc[W][G][8 * L];
  float m[W][G], l[W][G];
};

}  // namespace gyre::cuda::decode_attn
