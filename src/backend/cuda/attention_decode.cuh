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

#include "backend/cuda/attention_decode_common.cuh"
#include "backend/cuda/attention_decode_mma.cuh"

namespace gyre::cuda::decode_attn {

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

// The scalar loop (every cache type and head dim % 8 == 0): this warp's steps of KT keys over
// [my_lo, my_hi), its state left in ws. rq: q is rotated as it is loaded (QRope).
template <int T, int L, int G, class Kv>
__device__ __forceinline__ void scalar_loop(const Kv& kv, const half* qrow, int D, int gn,
                                            int my_lo, int my_hi, float scale, const QRope* rq,
                                            WarpStates<G, L>& ws) {
  constexpr int R = 32 / L;  // rows per load instruction
  // Row loads per lane per step (registers: 8 dims each, raw and decoded): 8, 4 for 8 heads;
  // 16 for q4 rows of one head (4-byte loads: more rows keep as many bytes in flight). Measured
  // on H100, llama2-7b shape at 8k/32k keys: q4 32.5/107.4 us -> 31.0/101.4 with 16; q8 went
  // the other way (35.6/111.9 -> 39.0/119.5: 3 instead of 5 resident blocks), so it keeps 8.
  constexpr int U = G >= 8 ? 4 : (T == kKvQ4 && G == 1 ? L : 8);
  constexpr int KT = R * U;     // keys per warp step
  constexpr int kSpan = L / U;  // lanes that hold one key's score after the reduction
  static_assert(U <= L && KT <= 32, "one key per lane after the reduce-scatter");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int l = lane % L, r = lane / L;
  const int d0 = 8 * l;
  const bool active = d0 < D;

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
      for (int e = 0; e < 8; ++e) ws.acc[warp][g][d0 + e] = acc[g][e];
    }
    if (lane == 0) {
      ws.m[warp][g] = m[g];
      ws.l[warp][g] = lsum[g];
    }
  }
}

// The block's end: the warps' states merged into the output (one share) or the block's partial,
// then the combine by the last block of the row's head group (attention_share.cuh).
template <int G, int L, int W>
__device__ __forceinline__ void finish_block(const WarpStates<G, L, W>& ws,
                                             split_share::OutRow orow, float* part, int D, int gn,
                                             int split, int splits, const split_share::Share& share,
                                             const split_share::Combine& cmb) {
  __syncthreads();
  for (int i = threadIdx.x; i < gn * D; i += blockDim.x) {
    const int g = i / D, d = i % D;
    float mx = ws.m[0][g];
#pragma unroll
    for (int w = 1; w < W; ++w) mx = fmaxf(mx, ws.m[w][g]);
    float a = 0.0f, sum = 0.0f;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float f = __expf(ws.m[w][g] - mx);  // 0 for a warp without keys (m = -FLT_MAX)
      a += ws.acc[w][g][d] * f;
      sum += ws.l[w][g] * f;
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

// Attends the row's query heads [0, gn) (gn <= G, at qrow / orow) over keys [lo, hi) cut into
// `splits` shares; this block takes share `split` (attention_share.cuh: cmb). pro: the block's
// prologue (RopePrologue, or NoPrologue after the caller's pdl_wait); this lets the next kernel in.
// rq: q is rotated as it is loaded (QRope; qrow itself is left as it is). part: as split_attend's
// ((D + 2) floats per (head, split): acc, m, l; heads `splits` shares apart). L lanes per row (8
// or 16, D <= 8 L). MMA: the tensor-core loop (attention_decode_mma.cuh: FP16 cache, G >= 4,
// mma_usable(D)) instead of the scalar one; the block then has threads_of(true) threads, else
// threads_of(false).
template <int T, int L, int G, bool MMA, class Kv, class Pro = NoPrologue>
__device__ __forceinline__ void decode_attend(const Kv& kv, const half* qrow,
                                              split_share::OutRow orow, float* part, int D, int gn,
                                              int lo, int hi, int split, int splits, float scale,
                                              const split_share::Combine& cmb,
                                              const QRope* rq = nullptr, const Pro& pro = Pro{}) {
  const split_share::Share share = split_share::share_of(
      lo, hi, split, splits, cmb.counter != nullptr, cmb.single_span, cmb.min_chunk);
  if (share.idle) return;
  // Short contexts let the next kernel in right after the wait, long ones once the keys are read.
  struct Waited {
    const Pro& pro;
    int safe_hi, span;
    const split_share::Combine& cmb;
    bool triggered;
    __device__ void wait() {
      pro.wait();
      triggered = split_share::early_trigger(span, cmb);
    }
    __device__ void store() const { pro.store(); }
  } w{pro, pro.safe_hi, hi - lo, cmb, false};
  __shared__ WarpStates<G, L, MMA ? kMmaWarps : kWarps> ws;
  if constexpr (MMA) {
    mma_loop(kv, qrow, D, gn, share.lo, share.hi, scale, rq, w, ws);
  } else {
    w.wait();
    w.store();
    scalar_loop<T, L, G>(kv, qrow, D, gn, share.lo, share.hi, scale, rq, ws);
  }
  if (!w.triggered) pdl_launch_dependents();  // long contexts: the keys are read
  finish_block(ws, orow, part, D, gn, split, splits, share, cmb);
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

// Calls f(T, L, G, MMA) (integral constants) for the decode kernel of cache type kv_type, head_dim
// and gn query heads per block: the tensor-core loop (with L = 16) where it applies and `mma`.
template <class F>
void with_kernel(int kv_type, int head_dim, int gn, bool mma, F&& f) {
  with_kv_kind(kv_type, [&](auto kind) {
    constexpr bool kF16 = decltype(kind)::value == kKvF16;
    with_shape(head_dim, gn, [&](auto lanes, auto g) {
      if constexpr (kF16 && decltype(g)::value >= 4) {
        if (mma && mma_usable(head_dim)) {
          f(kind, std::integral_constant<int, 16>{}, g, std::true_type{});
          return;
        }
      }
      f(kind, lanes, g, std::false_type{});
    });
  });
}

}  // namespace gyre::cuda::decode_attn
