// The decode block's tensor-core loop: FP16 cache, 4 or 8 query heads per block (GQA), head dims
// a multiple of 32 up to 128. Same contract as scalar_loop (attention_decode.cuh): this warp's
// steps of 16 keys over [my_lo, my_hi), its state left in WarpStates for finish_block. Its blocks
// have kMmaWarps (8) warps and ~240 registers per thread: one block per SM, so the split count
// (attention_splits: one wave of resident blocks) gives 16 shares per head group on 132 SMs.
// Why (H100, Llama-3-8B shape, 4-bit weights, 8k keys; bench/NOTES.md sessions 21-22): ncu showed
// the scalar loop issue-bound (~1,190 instructions per 16-key step for 4 heads: f32 dot products,
// a reduce-scatter of the scores, a shuffle per value row; 27% of issue slots, DRAM at 39%), and
// the first tensor-core loop (S = Q K^T and O = P V with the heads as the 16 rows of A: half of
// every mma on padding rows, 32 mma and ~700 instructions per step) still latency-bound per warp.
// Layouts (lane = 4 g + t), with the heads as the 8 columns instead: S^T = K Q^T (A = K: rows
// keys g and g + 8 of the step, the contraction over head dims; B = Q^T) and O^T = V^T P^T (A =
// V^T: rows head dims, the contraction over the 16 keys; B = P^T): 16 mma per step. A dot product
// may take its dims in any order, so each lane loads 16-byte pieces of key rows (chunk 4i + t of
// keys g and g + 8: coalesced, 64 bytes per row per load) and q's B fragment follows the same
// order. S^T's C fragment (keys g, g + 8 by heads 2t, 2t + 1) becomes P^T's B fragment (keys 2t,
// 2t + 1, 2t + 8, 2t + 9 of head g) by two 8x8 transposes (movmatrix). V^T's A fragment pairs two
// keys of one dim: lane (g, t) loads chunk g (and g + 8) of keys 2t, 2t + 1, 2t + 8, 2t + 9 and
// pairs their halves with byte permutes, so m-tile e holds dims 8 g + e and 8 (g + 8) + e.
// Each warp keeps the next step's rows in flight while it computes one.
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

// mma.sync m16n8k16 (f32 accumulate) as attention_flash.cuh's mma16816, but not volatile: it has
// no side effects, so the compiler may schedule it among the step's other instructions.
__device__ __forceinline__ void mma_f32(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                        unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The warp's 8x8 matrix of halves (lane 4 r + c holds row r, columns 2c and 2c + 1) transposed.
__device__ __forceinline__ unsigned transpose8x8(unsigned x) {
  unsigned y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

template <int G, int L, int W, class Kv, class Pro>
__device__ __forceinline__ void mma_loop(const Kv& kv, const half* qrow, int D, int gn, int my_lo,
                                         int my_hi, float scale, const QRope* rq, Pro& pro,
                                         WarpStates<G, L, W>& ws) {
  static_assert(G >= 4 && G <= 8, "a block's query heads are the 8 columns of the mma");
  using flash_attn::pack_half2;
  constexpr int kSteps = kMaxHeadDim / 16;  // k-steps of S over the head dims
  // Rows past gn are zeros (columns of Q^T without a head: their outputs are not stored).
  __shared__ __align__(16) half q_s[8][kMaxHeadDim];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int chunks = D / 8, steps = D / 16;

  // A step's key and value rows: K rows of keys base + g and base + 8 + g (the two n-tiles of S),
  // chunks 4i + t; V rows of keys base + 2t + (r & 1) + 8 (r >> 1), chunks g and g + 8. No load
  // depends on the lane's key: keys past the share read the share's last row (finite, and their p
  // is 0), value chunks past D read the row's last chunk (they feed output dims past D only,
  // which are never stored), and chunks % 4 == 0 makes the K rows' bound warp-uniform. Pieces
  // past D are left unloaded (K: the k-steps past D do not run; V: they feed only output dims
  // past D, which are never stored).
  struct Rows {
    uint4 k[2][kSteps / 2], v[4][2];
  };
  // Contiguous cache: the head's planes (rows as 32-bit offsets from them: max_seq D < 2^31).
  const half* k_head = static_cast<const half*>(kv.k);
  const half* v_head = static_cast<const half*>(kv.v);
  if constexpr (Kv::kContiguous) {
    k_head += kv.row(0) * D;
    v_head += kv.row(0) * D;
  }
  auto load = [&](int base, Rows& rows) {
    const int last = my_hi - 1;
    int64_t lane_row = 0;  // paged: the row of key base + lane (lanes < 16), one table read each
    if constexpr (!Kv::kContiguous)
      if (lane < 16) lane_row = kv.row(min(base + lane, last));
    auto row_of = [&](const half* head, const void* plane, int n) -> const half* {
      if constexpr (Kv::kContiguous)
        return head + min(base + n, last) * D;
      else
        return static_cast<const half*>(plane) + __shfl_sync(0xffffffffu, lane_row, n) * D;
    };
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const half* k = row_of(k_head, kv.k, 8 * nt + g) + 8 * t;
#pragma unroll
      for (int i = 0; i < kSteps / 2; ++i)  // (unused past D: not loaded)
        if (4 * i < chunks) rows.k[nt][i] = *reinterpret_cast<const uint4*>(k + 32 * i);
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const half* v = row_of(v_head, kv.v, 2 * t + (r & 1) + 8 * (r >> 1));
#pragma unroll
      for (int h = 0; h < 2; ++h)  // (feeds only output dims past D where not loaded)
        if (8 * h < chunks)
          rows.v[r][h] = *reinterpret_cast<const uint4*>(v + 8 * min(g + 8 * h, chunks - 1));
    }
  };

  // The first two steps, where every key of them is in the cache before the prologue (the block's
  // prologue then hides their latency: two of a warp's four steps at 8k keys on 132 SMs).
  const int stride = W * 16, first = my_lo + warp * 16;
  auto early = [&](int base) { return base < my_hi && min(base + 16, my_hi) <= pro.safe_hi; };
  const bool pre0 = early(first), pre1 = pre0 && early(first + stride);
  Rows ra, rb;  // the steps at base and base + stride of the loop below
  if (pre0) load(first, ra);
  if (pre1) load(first + stride, rb);
  pro.wait();

  // q of the block's heads (zeros past gn), its loads issued before the prologue's store, rotated
  // as rope.cu does and rounded to FP16 as it stores; the softmax scale is applied to the f32
  // scores instead. One 16-byte piece per thread.
  static_assert(8 * (kMaxHeadDim / 8) <= 32 * W, "one q piece per thread");
  const int qh = threadIdx.x / chunks, qc = threadIdx.x - qh * chunks;
  const bool q_piece = qh < 8;
  const uint4 qv = q_piece && qh < gn ? *reinterpret_cast<const uint4*>(qrow + qh * D + 8 * qc)
                                      : make_uint4(0, 0, 0, 0);
  pro.store();
  if (q_piece) *reinterpret_cast<uint4*>(&q_s[qh][8 * qc]) = qv;
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
  // This lane's B fragments of Q^T (head g), k-step st: chunk 4 (st / 2) + t of q's row, words
  // 2 (st % 2) and 2 (st % 2) + 1 (the dims `load` gives the K rows' A fragments).
  uint2 qf[kSteps];
#pragma unroll
  for (int st = 0; st < kSteps; ++st)
    qf[st] = *reinterpret_cast<const uint2*>(&q_s[g][8 * (4 * (st / 2) + t) + 4 * (st % 2)]);
  // O^T = V^T P^T: m-tile e holds dims 8 g + e (rows g) and 8 (g + 8) + e (rows g + 8), columns
  // are the heads: o[e] = {O[2t][8g + e], O[2t + 1][8g + e], O[2t][8(g + 8) + e],
  // O[2t + 1][8(g + 8) + e]}. m, lsum: heads 2t and 2t + 1 (lsum over this lane's keys).
  float o[8][4];
#pragma unroll
  for (int e = 0; e < 8; ++e) o[e][0] = o[e][1] = o[e][2] = o[e][3] = 0.0f;
  float m[2] = {-FLT_MAX, -FLT_MAX}, lsum[2] = {0.0f, 0.0f};

  // One step: S^T = K Q^T of its 16 keys (rows: keys g, g + 8; columns: heads 2t, 2t + 1), the
  // online softmax per head, P^T to a B fragment by two 8x8 transposes, O^T += V^T P^T.
  auto step = [&](int base, const Rows& rows) {
    const auto& kr = rows.k;
    const auto& vr = rows.v;
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int st = 0; st < kSteps; ++st) {
      if (st >= steps) break;  // warp-uniform
      const uint4& k0 = kr[0][st / 2];
      const uint4& k1 = kr[1][st / 2];
      const unsigned a[4] = {st % 2 ? k0.z : k0.x, st % 2 ? k1.z : k1.x, st % 2 ? k0.w : k0.y,
                             st % 2 ? k1.w : k1.y};
      mma_f32(s, a, qf[st].x, qf[st].y);
    }
    const bool ok0 = base + g < my_hi, ok1 = base + g + 8 < my_hi;
    float sc[4] = {ok0 ? s[0] * scale : -FLT_MAX, ok0 ? s[1] * scale : -FLT_MAX,
                   ok1 ? s[2] * scale : -FLT_MAX, ok1 ? s[3] * scale : -FLT_MAX};
    float mx[2] = {fmaxf(sc[0], sc[2]), fmaxf(sc[1], sc[3])};
#pragma unroll
    for (int off = 4; off < 32; off <<= 1)
#pragma unroll
      for (int c = 0; c < 2; ++c) mx[c] = fmaxf(mx[c], __shfl_xor_sync(0xffffffffu, mx[c], off));
    float alpha[2], p[4];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const float m_new = fmaxf(m[c], mx[c]);  // key base is in the share: finite
      alpha[c] = __expf(m[c] - m_new);
      m[c] = m_new;
      p[c] = ok0 ? __expf(sc[c] - m_new) : 0.0f;
      p[c + 2] = ok1 ? __expf(sc[c + 2] - m_new) : 0.0f;
      lsum[c] = lsum[c] * alpha[c] + (p[c] + p[c + 2]);
    }
    const unsigned pb0 = transpose8x8(pack_half2(p[0], p[1]));  // keys 2t, 2t + 1 of head g
    const unsigned pb1 = transpose8x8(pack_half2(p[2], p[3]));  // keys 2t + 8, 2t + 9
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int c = e >> 1;
      const unsigned sel = (e & 1) ? 0x7632u : 0x5410u;
      const unsigned a[4] = {__byte_perm(word_of(vr[0][0], c), word_of(vr[1][0], c), sel),
                             __byte_perm(word_of(vr[0][1], c), word_of(vr[1][1], c), sel),
                             __byte_perm(word_of(vr[2][0], c), word_of(vr[3][0], c), sel),
                             __byte_perm(word_of(vr[2][1], c), word_of(vr[3][1], c), sel)};
      o[e][0] *= alpha[0];
      o[e][1] *= alpha[1];
      o[e][2] *= alpha[0];
      o[e][3] *= alpha[1];
      mma_f32(o[e], a, pb0, pb1);
    }
  };

  // Two steps in flight: while a warp computes one step, the next one's rows are on their way
  // (one step at a time left DRAM idle while every warp computed; H100, bench/NOTES.md session
  // 21). Unrolled by two so that the buffers alternate instead of being copied.
  if (!pre0 && first < my_hi) load(first, ra);
  bool rb_loaded = pre1;
  for (int base = first; base < my_hi; base += 2 * stride) {
    if (!rb_loaded && base + stride < my_hi) load(base + stride, rb);
    rb_loaded = false;
    step(base, ra);
    if (base + 2 * stride < my_hi) load(base + 2 * stride, ra);
    if (base + stride >= my_hi) break;
    step(base + stride, rb);
  }

#pragma unroll
  for (int c = 0; c < 2; ++c)
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) lsum[c] += __shfl_xor_sync(0xffffffffu, lsum[c], off);
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int head = 2 * t + c;
    if (head >= gn) continue;  // (gn <= G)
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (8 * g + e < D) ws.acc[warp][head][8 * g + e] = o[e][c];
      if (8 * (g + 8) + e < D) ws.acc[warp][head][8 * (g + 8) + e] = o[e][c + 2];
    }
    if (g == 0) {
      ws.m[warp][head] = m[c];
      ws.l[warp][head] = lsum[c];
    }
  }
}

}  // namespace gyre::cuda::decode_attn
