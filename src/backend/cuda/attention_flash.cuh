// The tensor-core prefill tile shared by the contiguous cache (attention_prefill.cu) and the
// paged cache (paged_attention.cu): 64 consecutive query rows of one sequence and one head,
// each of the 4 warps owning 16 rows, over keys [first, last] of the tile in tiles of 64 keys
// (K and V staged in shared memory, 16-byte loads): S = Q K^T with WMMA (FP16 in, f32
// accumulate), a warp-level online softmax over S in shared memory (causal and sliding-window
// masks, running max/sum per row), then O += P V with WMMA into f32 accumulators kept in shared
// memory (WMMA fragments have no defined row mapping, so the per-row rescale of O is done there).
// Softmax rows are walked by the whole warp (lanes across keys) and shared-memory rows are
// padded: the first version (lane pairs per row, unpadded rows) hit 16-way bank conflicts and
// ran at ~8 TFLOP/s (4.4 ms per Llama-3-8B layer at 2048 tokens, ncu).
// Where key rows live is the Kv policy's business: int64_t Kv::row(int j) is the row index of
// key j in the planes kv.k/kv.kp (and of its value in kv.v/kv.vp), for the tile's KV head.
// The cache type T (kv_quant.cuh) is a template parameter: q8/q4 rows are dequantized into the
// FP16 K/V tiles as they are staged, so the tensor-core part is the same for every type.
#pragma once
#include <mma.h>

#include <cfloat>

#include "backend/cuda/kv_quant.cuh"
#include "backend/cuda/launch.h"

namespace gyre::cuda::flash_attn {

using namespace nvcuda;

constexpr int kBlockQ = 64, kBlockK = 64, kWarps = 4, kThreads = kWarps * 32;

// Shared-memory row strides, padded by 16 bytes so that rows do not start in the same banks.
template <int D>
struct Smem {
  static constexpr int qs = D + 8;        // halves, Q/K/V rows
  static constexpr int ss = kBlockK + 4;  // floats, S rows
  static constexpr int ps = kBlockK + 8;  // halves, P rows
  static constexpr int os = D + 4;        // floats, O rows
  static constexpr size_t q = 0;
  static constexpr size_t k = q + kBlockQ * qs * 2;
  static constexpr size_t v = k + kBlockK * qs * 2;
  static constexpr size_t s = v + kBlockK * qs * 2;
  static constexpr size_t p = s + kWarps * 16 * ss * 4;
  static constexpr size_t o = p + kWarps * 16 * ps * 2;
  static constexpr size_t bytes = o + kWarps * 16 * os * 4;
};

// Query rows [0, tile_rows) at q + r * row_stride (this head's columns; out likewise) have
// positions tile_pos0 + r.
template <int D, int T, class Kv>
__device__ __forceinline__ void flash_tile(const Kv& kv, const half* q, half* out,
                                           int64_t row_stride, int tile_rows, int tile_pos0,
                                           int window, float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  using L = Smem<D>;
  half* q_s = reinterpret_cast<half*>(smem + L::q);
  half* k_s = reinterpret_cast<half*>(smem + L::k);
  half* v_s = reinterpret_cast<half*>(smem + L::v);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float* s_w = reinterpret_cast<float*>(smem + L::s) + warp * 16 * L::ss;
  half* p_w = reinterpret_cast<half*>(smem + L::p) + warp * 16 * L::ps;
  float* o_w = reinterpret_cast<float*>(smem + L::o) + warp * 16 * L::os;

  // Q tile (rows past tile_rows are zero) and zeroed accumulators.
  for (int i = tid; i < kBlockQ * D / 8; i += kThreads) {
    const int r = i / (D / 8), c = (i % (D / 8)) * 8;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (r < tile_rows) val = *reinterpret_cast<const uint4*>(q + r * row_stride + c);
    *reinterpret_cast<uint4*>(q_s + r * L::qs + c) = val;
  }
  for (int i = lane; i < 16 * L::os; i += 32) o_w[i] = 0.0f;
  // Softmax state of the warp's 16 rows, the same in every lane (rows are processed by the
  // whole warp, one at a time, lanes across the keys: no bank conflicts).
  float m_r[16], l_r[16];
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    m_r[r] = -1e30f;
    l_r[r] = 0.0f;
  }
  const int row_pos0 = tile_pos0 + warp * 16;

  const int last_pos = tile_pos0 + min(tile_rows, kBlockQ) - 1;
  int first_key = 0;
  if (window > 0) first_key = max(0, tile_pos0 - window + 1) / kBlockK * kBlockK;

  for (int k0 = first_key; k0 <= last_pos; k0 += kBlockK) {
    __syncthreads();  // previous tile fully consumed (and Q/O initialised on the first pass)
    for (int i = tid; i < kBlockK * D / 8; i += kThreads) {
      const int r = i / (D / 8), c = (i % (D / 8)) * 8;
      uint4 kr = make_uint4(0, 0, 0, 0), vr = make_uint4(0, 0, 0, 0);
      if (k0 + r <= last_pos) {
        const int64_t row = kv.row(k0 + r);
        kr = kv_load8_half<T>(kv_row<T>(kv.k, kv.kp, row, D), c);
        vr = kv_load8_half<T>(kv_row<T>(kv.v, kv.vp, row, D), c);
      }
      *reinterpret_cast<uint4*>(k_s + r * L::qs + c) = kr;
      *reinterpret_cast<uint4*>(v_s + r * L::qs + c) = vr;
    }
    __syncthreads();

    // S[16][64] = Q_w K^T
    for (int kt = 0; kt < kBlockK / 16; ++kt) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> fb;
        wmma::load_matrix_sync(fa, q_s + warp * 16 * L::qs + kk * 16, L::qs);
        wmma::load_matrix_sync(fb, k_s + kt * 16 * L::qs + kk * 16, L::qs);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(s_w + kt * 16, acc, L::ss, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax, one row at a time; lanes hold keys lane and lane + 32.
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const int pos = row_pos0 + r;
      const float* srow = s_w + r * L::ss;
      const int key0 = k0 + lane, key1 = key0 + 32;
      const bool ok0 = key0 <= pos && (window <= 0 || key0 > pos - window);
      const bool ok1 = key1 <= pos && (window <= 0 || key1 > pos - window);
      const float v0 = ok0 ? srow[lane] * scale : -INFINITY;
      const float v1 = ok1 ? srow[lane + 32] * scale : -INFINITY;
      float mx = fmaxf(v0, v1);
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_new = fmaxf(m_r[r], mx);
      const float alpha = __expf(m_r[r] - m_new);
      const float p0 = __expf(v0 - m_new), p1 = __expf(v1 - m_new);
      float sum = p0 + p1;
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      l_r[r] = l_r[r] * alpha + sum;
      m_r[r] = m_new;
      half* prow = p_w + r * L::ps;
      prow[lane] = __float2half(p0);
      prow[lane + 32] = __float2half(p1);
      float* orow = o_w + r * L::os;
      for (int d = lane; d < D; d += 32) orow[d] *= alpha;
    }
    __syncwarp();

    // O_w[16][D] += P[16][64] V[64][D]
    for (int dt = 0; dt < D / 16; ++dt) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, o_w + dt * 16, L::os, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kBlockK / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> fb;
        wmma::load_matrix_sync(fa, p_w + kk * 16, L::ps);
        wmma::load_matrix_sync(fb, v_s + kk * 16 * L::qs + dt * 16, L::qs);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(o_w + dt * 16, acc, L::os, wmma::mem_row_major);
    }
    __syncwarp();
  }

#pragma unroll
  for (int r = 0; r < 16; ++r) {
    const int qr = warp * 16 + r;
    if (qr >= tile_rows) break;
    const float inv = l_r[r] > 0.0f ? 1.0f / l_r[r] : 0.0f;
    half* dst = out + qr * row_stride;
    for (int d = lane; d < D; d += 32) dst[d] = __float2half(o_w[r * L::os + d] * inv);
  }
}

}  // namespace gyre::cuda::flash_attn
