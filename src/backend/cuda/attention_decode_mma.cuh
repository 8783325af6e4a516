// The decode block's tensor-core loop: FP16 cache, 4 or 8 query heads per block (GQA), head dims
// a multiple of 32 up to 128. Same contract as scalar_loop (attention_decode.cuh): this warp's
// steps of 16 keys over [my_lo, my_hi), its state left in WarpStates for finish_block. Its blocks
// have kMmaWarps (8) warps and ~206 registers per thread: one block per SM, so the split count
// (attention_splits: one wave of resident blocks) gives 16 shares per head group on 132 SMs.
// Why (H100, Llama-3-8B shape, 4-bit weights, 8k keys; bench/NOTES.md session 21): ncu showed the
// scalar loop issue-bound (~1,190 instructions per 16-key step for 4 heads: f32 dot products, a
// reduce-scatter of the scores, a shuffle per value row; 27% of issue slots, DRAM at 39%). Here a
// step is 32 mma.sync m16n8k16 and ~400 other instructions, and each warp keeps the next step's
// rows in flight while it computes one (one step at a time left DRAM idle while every warp
// computed). Decode @8k 378 -> 390 tok/s; 4 warps per block at 2 blocks per SM reached 385-387.
// Layouts (lane = 4 g + t): S = Q K^T with A = Q (rows: the query heads, padded to 16 with zeros;
// the contraction runs over head dims) and B = K^T (columns: keys); the C fragment of S is, value
// for value, the A fragment of P for O += P V (as in attention_flash.cuh), with B = V (columns:
// head dims). A dot product may take its dims in any order, so each lane loads 16-byte pieces of
// key rows (chunk 4i + t of row g: coalesced, 64 bytes per row per load) and q's A fragment
// follows the same order. V's B fragment pairs two keys of one dim: lane (g, t) loads chunk g (and
// g + 8) of keys 2t, 2t + 1, 2t + 8, 2t + 9 and pairs their halves with byte permutes, so output
// column n of tile 8h + e is dim 8 (n + 8h) + e.
#pragma once
#include <cfloat>

#include "backend/cuda/attention_decode_common.cuh"
#include "backend/cuda/attention_flash.cuh"

namespace gyre::cuda::decode_attn {

inline __host__ __device__ bool mma_usable(int head_dim) {
  return head_dim % 32 == 0 && head_dim <= kMaxHeadDim;
}

// The component c (0..3) of a 16-byte load.
__device__ __forceinline__ unsigned word_of(const uint4& v, int c) {
  return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
}

template <int G, int L, int W, class Kv>
__device__ __forceinline__ void mma_loop(const Kv& kv, const half* qrow, int D, int gn, int my_lo,
                                         int my_hi, float scale, const QRope* rq,
                                         WarpStates<G, L, W>& ws) {
  static_assert(G >= 4 && G <= 8, "a block's query heads fill rows of the m16n8k16 A fragment");
  using flash_attn::mma16816;
  using flash_attn::pack_half2;
  constexpr int kSteps = kMaxHeadDim / 16;  // k-steps of S over the head dims
  constexpr int kTiles = kMaxHeadDim / 8;   // n-tiles of O
  // Rows past G stay zero: the A fragment's rows g < 8 are read without a branch (rows g + 8 are
  // the zero registers).
  __shared__ __align__(16) half q_s[8][kMaxHeadDim];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int chunks = D / 8, steps = D / 16;

  // A step's key and value rows: K rows of keys base + g and base + 8 + g (the two n-tiles of S),
  // chunks 4i + t; V rows of keys base + 2t + (r & 1) + 8 (r >> 1), chunks g and g + 8. Rows past
  // the share are zeros (their p is 0, and 0 * garbage could be NaN).
  struct Rows {
    uint4 k[2][kSteps / 2], v[4][2];
  };
  auto load = [&](int base, Rows& rows) {
    int64_t lane_row = 0;  // paged: the row of key base + lane (lanes < 16), one table read each
    if constexpr (!Kv::kContiguous)
      if (lane < 16 && base + lane < my_hi) lane_row = kv.row(base + lane);
    auto row_of = [&](int n) -> int64_t {
      if constexpr (Kv::kContiguous)
        return kv.row(base + n);
      else
        return __shfl_sync(0xffffffffu, lane_row, n);
    };
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int64_t row = row_of(8 * nt + g);
      const bool ok = base + 8 * nt + g < my_hi;
      const half* k = static_cast<const half*>(kv.k) + row * D;
#pragma unroll
      for (int i = 0; i < kSteps / 2; ++i)
        rows.k[nt][i] = ok && 4 * i + t < chunks
                            ? *reinterpret_cast<const uint4*>(k + 8 * (4 * i + t))
                            : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int n = 2 * t + (r & 1) + 8 * (r >> 1);
      const int64_t row = row_of(n);
      const bool ok = base + n < my_hi;
      const half* v = static_cast<const half*>(kv.v) + row * D;
#pragma unroll
      for (int h = 0; h < 2; ++h)
        rows.v[r][h] = ok && g + 8 * h < chunks
                           ? *reinterpret_cast<const uint4*>(v + 8 * (g + 8 * h))
                           : make_uint4(0, 0, 0, 0);
    }
  };

  // q of the block's heads (zeros past gn) rotated as rope.cu does and rounded to FP16 as it
  // stores; the softmax scale is applied to the f32 scores instead.
  for (int i = threadIdx.x; i < 8 * chunks; i += blockDim.x) {
    const int h = i / chunks, c = i - h * chunks;
    *reinterpret_cast<uint4*>(&q_s[h][8 * c]) =
        h < gn ? *reinterpret_cast<const uint4*>(qrow + h * D + 8 * c) : make_uint4(0, 0, 0, 0);
  }
  __syncthreads();
  if (rq != nullptr) {
    const int half_rot = rq->half_rot;
    for (int i = threadIdx.x; i < gn * half_rot; i += blockDim.x) {
      const int h = i / half_rot, p = i - h * half_rot;
      const int2 d = rope_pair_dims(p, half_rot, rq->interleaved);
      const float x0 = __half2float(q_s[h][d.x]), x1 = __half2float(q_s[h][d.y]);
      q_s[h][d.x] = __float2half(x0 * rq->cos[p] - x1 * rq->sin[p]);
      q_s[h][d.y] = __float2half(x0 * rq->sin[p] + x1 * rq->cos[p]);
    }
    __syncthreads();
  }
  float o[kTiles][2];  // head g, dims 8 (2t + 8h) + e and 8 (2t + 1 + 8h) + e of tile 8h + e
#pragma unroll
  for (int j = 0; j < kTiles; ++j) o[j][0] = o[j][1] = 0.0f;
  float m = -FLT_MAX, lsum = 0.0f;  // head g's running max; this lane's keys' sum

  // Two steps in flight: while a warp computes one step, the next one's rows are on their way
  // (one step at a time left DRAM idle while every warp computed; H100, bench/NOTES.md session
  // 21). Issuing the first step's loads before q is staged measured no faster.
  const int stride = W * 16, first = my_lo + warp * 16;
  Rows cur, next;
  if (first < my_hi) load(first, cur);

  for (int base = first; base < my_hi; base += stride) {
    if (base + stride < my_hi) load(base + stride, next);
    const auto& kr = cur.k;
    const auto& vr = cur.v;
    float s[2][4] = {};
#pragma unroll
    for (int st = 0; st < kSteps; ++st) {
      if (st >= steps) break;  // warp-uniform
      // {a0a1, a4a5} of head g: chunk 4 (st / 2) + t holds k-step st's dims, words 2 (st % 2)
      // and 2 (st % 2) + 1 (the order `load` gives the K rows' B fragments).
      const uint2 qw =
          *reinterpret_cast<const uint2*>(&q_s[g][8 * (4 * (st / 2) + t) + 4 * (st % 2)]);
      const unsigned a[4] = {qw.x, 0u, qw.y, 0u};
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const uint4& kw = kr[nt][st / 2];
        mma16816(s[nt], a, st % 2 ? kw.z : kw.x, st % 2 ? kw.w : kw.y);
      }
    }
    // Head g's scores of keys base + 2t, 2t + 1, 8 + 2t, 8 + 2t + 1.
    float sc[4] = {s[0][0], s[0][1], s[1][0], s[1][1]};
    float mx = -FLT_MAX;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const bool ok = base + 2 * t + (j & 1) + 8 * (j >> 1) < my_hi;
      sc[j] = ok ? sc[j] * scale : -FLT_MAX;
      mx = fmaxf(mx, sc[j]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m, mx);  // key base is in the share: finite
    const float alpha = __expf(m - m_new);
    m = m_new;
    float p[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) p[j] = sc[j] == -FLT_MAX ? 0.0f : __expf(sc[j] - m_new);
    lsum = lsum * alpha + (p[0] + p[1]) + (p[2] + p[3]);
    const unsigned pa[4] = {pack_half2(p[0], p[1]), 0u, pack_half2(p[2], p[3]), 0u};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (8 * h >= chunks) break;  // warp-uniform
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int c = e >> 1;
        const unsigned sel = (e & 1) ? 0x7632u : 0x5410u;
        const unsigned b0 = __byte_perm(word_of(vr[0][h], c), word_of(vr[1][h], c), sel);
        const unsigned b1 = __byte_perm(word_of(vr[2][h], c), word_of(vr[3][h], c), sel);
        float d[4] = {o[8 * h + e][0] * alpha, o[8 * h + e][1] * alpha, 0.0f, 0.0f};
        mma16816(d, pa, b0, b1);
        o[8 * h + e][0] = d[0];
        o[8 * h + e][1] = d[1];
      }
    }
    cur = next;
  }

  lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
  lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
  if (g < gn) {  // (gn <= G)
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      const int h = j >> 3, e = j & 7;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int d = 8 * (2 * t + c + 8 * h) + e;
        if (d < D) ws.acc[warp][g][d] = o[j][c];
      }
    }
    if (t == 0) {
      ws.m[warp][g] = m;
      ws.l[warp][g] = lsum;
    }
  }
}

}  // namespace gyre::cuda::decode_attn
