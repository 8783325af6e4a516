// The decode (few queries per sequence) attention block for head dims that are a multiple of 8
// up to 128, shared by the contiguous cache (attention.cu) and the paged cache
// (paged_attention.cu); other head dims take split_attend (attention_split.cuh).
// One block: the query heads of one row that share one KV head, over its share [lo, hi) of the
// keys (flash-decoding). Unlike split_attend, the block's warps never wait for each other until
// the end: each warp walks its own steps of KT keys (steps interleaved across warps) with its
// own online softmax (running max m and sum l per head, output accumulators in registers), and
// the warps' states are merged once through shared memory.
// A warp step: the warp reads KT key rows and KT value rows with coalesced loads (L lanes per
// row, 8 dims = one 16-byte FP16 load per lane; R = 32 / L rows per load instruction), all of
// them issued before the math, so a warp has up to 8 KB of K/V in flight (H100 measurements
// before this kernel: the 128-key chunk loop with shared f32 accumulators and one 4-byte value
// load per thread per key read K/V at ~1.0 TB/s at 8k context).
// Scores: each lane dots its 8 dims of each row with the (register) query of each head, then a
// reduce-scatter over the L lanes of the row leaves the full score of one key per lane. P.V: each
// lane accumulates its 8 dims of each head over its rows, p of a row broadcast by a shuffle.
// q8/q4 rows: codes loaded the same way (8 or 4 bytes per lane) with their block's params.
#pragma once
#include <cfloat>

#include "backend/cuda/attention_share.cuh"
#include "backend/cuda/kv_quant.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/rope_store.cuh"

namespace gyre::cuda::decode_attn {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
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
// wait (positions are staged by the host, the table is constant), q rotated in registers as
// decode_attend loads it (QRope), and the new key (rotated) and value stored into the cache by the
// block whose share ends at it, before its own key loop reads them (one round of 16-byte loads
// into shared memory, the rotation there, the store). With two query-head groups per KV head both
// such blocks store the same bytes.
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
  for (int i = threadIdx.x; i < 2 * chunks; i += kThreads) {
    const int kv = i / chunks, c = i - kv * chunks;
    const half* src = (kv ? r.v : r.k) + src_row * D + 8 * c;
    *reinterpret_cast<uint4*>(sm.kv[kv] + 8 * c) = *reinterpret_cast<const uint4*>(src);
  }
  __syncthreads();
  const int half_rot = r.rot_dim / 2;
  for (int i = threadIdx.x; i < half_rot; i += kThreads) {
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

// The block's part before decode_attend (every thread; not for a block without keys): cos/sin at
// `pos`, the PDL wait, the new row stored at crow when `store`; returns decode_attend's QRope.
template <int T>
__device__ __forceinline__ QRope rope_prologue(const RopeStoreArgs& r, int row, int kvh, int pos,
                                               int64_t crow, bool store, RopeSmem& sm) {
  rope_cos_sin(r, pos, sm.cos, sm.sin, threadIdx.x, kThreads);
  __syncthreads();
  pdl_wait();
  if (store) store_new_row<T>(r, row, kvh, crow, sm);
  return QRope{sm.cos, sm.sin, r.rot_dim / 2, r.rot_dim, r.interleaved};
}

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

// Reduce-scatter of N values across the lanes of a group (bits O, O/2, .., 1 of the lane):
// afterwards v[0] of a lane is the group's sum of value index (lane's group bits) >> (log2 of
// group size / N), i.e. lane l of a group of G lanes holds index l / (G / N).
template <int O, int N, int Total>
__device__ __forceinline__ void reduce_scatter(float (&v)[Total], int lane) {
  if constexpr (O >= 1) {
    if constexpr (N > 1) {
      const bool upper = (lane & O) != 0;
#pragma unroll
      for (int i = 0; i < N / 2; ++i) {
        const float send = upper ? v[i] : v[i + N / 2];
        const float keep = upper ? v[i + N / 2] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
      }
      reduce_scatter<O / 2, N / 2>(v, lane);
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], O);
      reduce_scatter<O / 2, 1>(v, lane);
    }
  }
}

// Attends the row's query heads [0, gn) (gn <= G, at qrow / orow) over keys [lo, hi) cut into
// `splits` shares; this block takes share `split` (attention_share.cuh: cmb). Call pdl_wait before:
// this lets the next kernel in. rq: q is rotated as it is loaded (QRope; qrow itself is left as it
// is). part: as split_attend's ((D + 2) floats per (head, split): acc, m, l; heads `splits` shares
// apart). L lanes per row (8 or 16, D <= 8 L).
template <int T, int L, int G, class Kv>
__device__ __forceinline__ void decode_attend(const Kv& kv, const half* qrow,
                                              split_share::OutRow orow, float* part, int D, int gn,
                                              int lo, int hi, int split, int splits, float scale,
                                              const split_share::Combine& cmb,
                                              const QRope* rq = nullptr) {
  constexpr int R = 32 / L;  // rows per load instruction
  // Row loads per lane per step (registers: 8 dims each, raw and decoded): 8, 4 for 8 heads;
  // 16 for q4 rows of one head (4-byte loads: more rows keep as many bytes in flight). Measured
  // on H100, llama2-7b shape at 8k/32k keys: q4 32.5/107.4 us -> 31.0/101.4 with 16; q8 went
  // the other way (35.6/111.9 -> 39.0/119.5: 3 instead of 5 resident blocks), so it keeps 8.
  constexpr int U = G >= 8 ? 4 : (T == kKvQ4 && G == 1 ? L : 8);
  constexpr int KT = R * U;     // keys per warp step
  constexpr int kSpan = L / U;  // lanes that hold one key's score after the reduction
  static_assert(U <= L && KT <= 32, "one key per lane after the reduce-scatter");
  __shared__ float acc_s[kWarps][G][8 * L];
  __shared__ float m_s[kWarps][G], l_s[kWarps][G];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int l = lane % L, r = lane / L;
  const int d0 = 8 * l;
  const bool active = d0 < D;

  const bool triggered = split_share::early_trigger(hi - lo, cmb);
  const split_share::Share share = split_share::share_of(
      lo, hi, split, splits, cmb.counter != nullptr, cmb.single_span, cmb.min_chunk);
  if (share.idle) return;
  const int my_lo = share.lo, my_hi = share.hi;

  // All heads' loads first (a shuffle is a point loads are not moved across), then the rotation.
  uint4 qraw[G];
#pragma unroll
  for (int g = 0; g < G; ++g)
    qraw[g] = g < gn && active ? *reinterpret_cast<const uint4*>(qrow + g * D + d0)
                               : make_uint4(0, 0, 0, 0);
  QRopeLane rl{};
  if (rq != nullptr) rl = rope_lane<L>(*rq, lane);
  float q[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const half2* h2 = reinterpret_cast<const half2*>(&qraw[g]);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __half22float2(h2[e]);
      q[g][2 * e] = f.x;
      q[g][2 * e + 1] = f.y;
    }
    if (rq != nullptr && g < gn) rope_q8(rl, rq->interleaved, q[g]);  // warp-uniform
#pragma unroll
    for (int e = 0; e < 8; ++e) q[g][e] *= scale;
  }
  float m[G], lsum[G], acc[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -FLT_MAX;
    lsum[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.0f;
  }

  for (int base = my_lo + warp * KT; base < my_hi; base += kWarps * KT) {
    // Row of key base + lane (lanes < KT): one page-table read per key for a paged cache.
    int64_t lane_row = 0;
    if constexpr (!Kv::kContiguous)
      if (lane < KT && base + lane < my_hi) lane_row = kv.row(base + lane);
    Dims8<T> kd[U], vd[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int key = r + R * u;
      int64_t row;
      if constexpr (Kv::kContiguous)
        row = kv.row(base + key);
      else
        row = __shfl_sync(0xffffffffu, lane_row, key);
      if (active && base + key < my_hi) {
        load_dims8<T>(kd[u], kv.k, kv.kp, row, D, d0);
        load_dims8<T>(vd[u], kv.v, kv.vp, row, D, d0);
      } else {
        zero_dims8<T>(kd[u]);
        zero_dims8<T>(vd[u]);
      }
    }
    // Partial scores of this lane's 8 dims, then the full score of key (r + R * (l / kSpan)).
    float s[G][U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float kf[8];
      decode_dims8<T>(kd[u], kf);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float a = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) a += q[g][e] * kf[e];
        s[g][u] = a;
      }
    }
    const bool key_ok = base + r + R * (l / kSpan) < my_hi;
    const bool counts = key_ok && l % kSpan == 0;  // one lane per key adds to l
    float p[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      reduce_scatter<L / 2, U>(s[g], l);
      const float sc = key_ok ? s[g][0] : -FLT_MAX;
      float mx = sc;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_new = fmaxf(m[g], mx);
      const float alpha = __expf(m[g] - m_new);
      m[g] = m_new;
      p[g] = key_ok ? __expf(sc - m_new) : 0.0f;
      lsum[g] = lsum[g] * alpha + (counts ? p[g] : 0.0f);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] *= alpha;
    }
    // P.V: row (r + R * u) of this lane's group; its p is held by lane r * L + u * kSpan.
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float vf[8];
      decode_dims8<T>(vd[u], vf);
      const int src = r * L + u * kSpan;
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float pg = __shfl_sync(0xffffffffu, p[g], src);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] += pg * vf[e];
      }
    }
  }

  if (!triggered) {  // long contexts: the next kernel is let in now that the keys are read
    pdl_launch_dependents();
  }
  // Merge the warp's row groups (same dims, other keys), then the warps.
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int o = L; o < 32; o *= 2) {
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], o);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) lsum[g] += __shfl_xor_sync(0xffffffffu, lsum[g], o);
    if (r == 0) {
#pragma unroll
      for (int e = 0; e < 8; ++e) acc_s[warp][g][d0 + e] = acc[g][e];
    }
    if (lane == 0) {
      m_s[warp][g] = m[g];
      l_s[warp][g] = lsum[g];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < gn * D; i += kThreads) {
    const int g = i / D, d = i % D;
    float mx = m_s[0][g];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) mx = fmaxf(mx, m_s[w][g]);
    float a = 0.0f, sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = __expf(m_s[w][g] - mx);  // 0 for a warp without keys (m = -FLT_MAX)
      a += acc_s[w][g][d] * f;
      sum += l_s[w][g] * f;
    }
    if (share.shares == 1) {
      orow.put(i, sum > 0.0f ? a / sum : 0.0f);
    } else {
      float* pp = part + (static_cast<int64_t>(g) * splits + split) * (D + 2);
      pp[d] = a;
      if (d == 0) {
        pp[D] = mx;
        pp[D + 1] = sum;
      }
    }
  }
  if (share.shares > 1 && cmb.counter != nullptr)
    split_share::combine_if_last<(G >= 4)>(part, orow, cmb.counter, D, gn, splits, share.shares,
                                           cmb.weighted_from);
}

// Calls f(std::integral_constant<int, L>{}, std::integral_constant<int, G>{}) for the lanes per
// row of head_dim and the group template of gn query heads per block.
template <class F>
void with_shape(int head_dim, int gn, F&& f) {
  const int lanes = lanes_for(head_dim), group = group_for(gn);
  auto by_group = [&](auto lanes_c) {
    if (group == 1)
      f(lanes_c, std::integral_constant<int, 1>{});
    else if (group == 4)
      f(lanes_c, std::integral_constant<int, 4>{});
    else
      f(lanes_c, std::integral_constant<int, 8>{});
  };
  if (lanes == 8)
    by_group(std::integral_constant<int, 8>{});
  else
    by_group(std::integral_constant<int, 16>{});
}

}  // namespace gyre::cuda::decode_attn
