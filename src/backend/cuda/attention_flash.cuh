// The tensor-core prefill tile shared by the contiguous cache (attention_prefill.cu) and the
// paged cache (paged_attention.cu): 64 consecutive query rows of one sequence and one head,
// each of the 4 warps owning 16 rows, over keys [first, last] of the tile in tiles of 64 keys
// (flash-attention 2 style). K and V tiles are double-buffered in shared memory (FP16: cp.async,
// so the next tile streams in while this one is multiplied); S = Q K^T and O += P V run on
// mma.sync m16n8k16 with every operand fetched by ldmatrix, and S, P, O and the softmax state
// live in registers: the C fragment of S is, element for element, the A fragment of P, so the
// softmax never touches shared memory.
// History: a WMMA version kept S and O in shared memory (WMMA fragments have no defined row
// mapping, so the per-row rescale needed a round trip) and ran at ~40 TFLOP/s on H100
// (0.87 ms per Llama-3-8B layer at 2048 tokens): a third of the whole 2048-token prefill.
// Where key rows live is the Kv policy's business: int64_t Kv::row(int j) is the row index of
// key j in the planes kv.k/kv.kp (and of its value in kv.v/kv.vp), for the tile's KV head.
// The cache type T (kv_quant.cuh) is a template parameter: q8/q4 rows are dequantized into the
// FP16 K/V tiles as they are staged, so the tensor-core part is the same for every type.
#pragma once
#include <cfloat>

#include "backend/cuda/kv_quant.cuh"
#include "backend/cuda/launch.h"

namespace gyre::cuda::flash_attn {

constexpr int kBlockQ = 64, kBlockK = 64, kWarps = 4, kThreads = kWarps * 32;

// Shared-memory rows padded by 16 bytes: the 8 row addresses of an ldmatrix then fall in 8
// different 16-byte bank groups for every supported head dim (64, 80, 96, 128).
template <int D>
struct Smem {
  static constexpr int stride = D + 8;  // halves
  static constexpr size_t tile = static_cast<size_t>(kBlockK) * stride * 2;
  static constexpr size_t q = 0;
  static constexpr size_t k = q + static_cast<size_t>(kBlockQ) * stride * 2;  // 2 buffers
  static constexpr size_t v = k + 2 * tile;                                   // 2 buffers
  static constexpr size_t bytes = v + 2 * tile;
};

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], const half* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(unsigned (&r)[4], const half* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
// d += a * b (m16n8k16, FP16 in, f32 accumulate).
__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ unsigned pack_half2(float lo, float hi) {
  const half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&h);
}

// Stages keys [k0, k0 + 64) (rows past last_pos as zeros: their P is 0, and 0 * garbage could
// be NaN) into k_s/v_s. FP16 goes through cp.async (committed by the caller); q8/q4 rows are
// dequantized through registers.
template <int D, int T, class Kv>
__device__ __forceinline__ void stage_kv(const Kv& kv, half* k_s, half* v_s, int k0, int last_pos) {
  constexpr int S = Smem<D>::stride;
  for (int i = threadIdx.x; i < kBlockK * D / 8; i += kThreads) {
    const int r = i / (D / 8), c = (i % (D / 8)) * 8;
    const bool valid = k0 + r <= last_pos;
    const int64_t row = kv.row(valid ? k0 + r : k0);
    const KvRow kr = kv_row<T>(kv.k, kv.kp, row, D), vr = kv_row<T>(kv.v, kv.vp, row, D);
    if constexpr (T == kKvF16) {
      cp_async16_zfill(k_s + r * S + c, kr.codes + 2 * c, valid);
      cp_async16_zfill(v_s + r * S + c, vr.codes + 2 * c, valid);
    } else {
      uint4 kq = make_uint4(0, 0, 0, 0), vq = make_uint4(0, 0, 0, 0);
      if (valid) {
        kq = kv_load8_half<T>(kr, c);
        vq = kv_load8_half<T>(vr, c);
      }
      *reinterpret_cast<uint4*>(k_s + r * S + c) = kq;
      *reinterpret_cast<uint4*>(v_s + r * S + c) = vq;
    }
  }
  asm volatile("cp.async.commit_group;");
}

// Query rows [0, tile_rows) at q + r * row_stride (this head's columns; out likewise) have
// positions tile_pos0 + r.
template <int D, int T, class Kv>
__device__ __forceinline__ void flash_tile(const Kv& kv, const half* q, half* out,
                                           int64_t row_stride, int tile_rows, int tile_pos0,
                                           int window, float scale) {
  static_assert(D % 16 == 0 && D <= 128, "head dim");
  constexpr int S = Smem<D>::stride;
  extern __shared__ __align__(128) unsigned char smem[];
  half* q_s = reinterpret_cast<half*>(smem + Smem<D>::q);
  half* k_s = reinterpret_cast<half*>(smem + Smem<D>::k);
  half* v_s = reinterpret_cast<half*>(smem + Smem<D>::v);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;    // fragment row (and row + 8) / column pair
  const int mi = lane >> 3, mr = lane & 7;  // ldmatrix: which 8x8 matrix this lane addresses

  const int last_pos = tile_pos0 + min(tile_rows, kBlockQ) - 1;
  int first_key = 0;
  if (window > 0) first_key = max(0, tile_pos0 - window + 1) / kBlockK * kBlockK;
  const int n_tiles = (last_pos - first_key) / kBlockK + 1;

  for (int i = tid; i < kBlockQ * D / 8; i += kThreads) {
    const int r = i / (D / 8), c = (i % (D / 8)) * 8;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (r < tile_rows) val = *reinterpret_cast<const uint4*>(q + r * row_stride + c);
    *reinterpret_cast<uint4*>(q_s + r * S + c) = val;
  }
  stage_kv<D, T>(kv, k_s, v_s, first_key, last_pos);
  __syncthreads();

  // Q as A fragments, one per 16 dims: matrices (rows 0-7 | 8-15) x (dims +0 | +8).
  unsigned qf[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    ldsm_x4(qf[kk], q_s + (warp * 16 + (mi & 1) * 8 + mr) * S + kk * 16 + (mi >> 1) * 8);

  float o[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m0 = -1e30f, m1 = -1e30f, l0 = 0.0f, l1 = 0.0f;  // rows g and g + 8 (l: this lane's part)
  const float scale2 = scale * 1.4426950408889634f;      // exp(x) = exp2(x log2 e)
  const int pos0 = tile_pos0 + warp * 16 + g, pos1 = pos0 + 8;

  for (int it = 0; it < n_tiles; ++it) {
    const int k0 = first_key + it * kBlockK;
    const int buf = it & 1;
    if (it + 1 < n_tiles) {
      const size_t next = static_cast<size_t>(buf ^ 1) * kBlockK * S;
      stage_kv<D, T>(kv, k_s + next, v_s + next, k0 + kBlockK, last_pos);
      asm volatile("cp.async.wait_group 1;");
    } else {
      asm volatile("cp.async.wait_group 0;");
    }
    __syncthreads();
    const half* kt = k_s + static_cast<size_t>(buf) * kBlockK * S;
    const half* vt = v_s + static_cast<size_t>(buf) * kBlockK * S;

    // Warps whose rows all precede this tile's keys have nothing to add (causal).
    if (k0 <= tile_pos0 + warp * 16 + 15) {
      float s[kBlockK / 8][4];
#pragma unroll
      for (int j = 0; j < kBlockK / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < kBlockK / 16; ++np) {
          unsigned b[4];  // keys (+0 | +8) x dims (+0 | +8)
          ldsm_x4(b, kt + (np * 16 + (mi >> 1) * 8 + mr) * S + kk * 16 + (mi & 1) * 8);
          mma16816(s[2 * np], qf[kk], b[0], b[1]);
          mma16816(s[2 * np + 1], qf[kk], b[2], b[3]);
        }
      }
      // Online softmax of rows g, g + 8; a row's 64 keys are spread over the 4 lanes of a quad.
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int j = 0; j < kBlockK / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = k0 + j * 8 + 2 * t + e;
          const bool ok0 = key <= pos0 && (window <= 0 || key > pos0 - window);
          const bool ok1 = key <= pos1 && (window <= 0 || key > pos1 - window);
          s[j][e] = ok0 ? s[j][e] * scale2 : -INFINITY;
          s[j][2 + e] = ok1 ? s[j][2 + e] * scale2 : -INFINITY;
          mx0 = fmaxf(mx0, s[j][e]);
          mx1 = fmaxf(mx1, s[j][2 + e]);
        }
      }
#pragma unroll
      for (int off = 1; off < 4; off <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
      }
      const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
      const float a0 = exp2f(m0 - n0), a1 = exp2f(m1 - n1);
      m0 = n0;
      m1 = n1;
      float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
      for (int j = 0; j < kBlockK / 8; ++j) {
        s[j][0] = exp2f(s[j][0] - n0);
        s[j][1] = exp2f(s[j][1] - n0);
        s[j][2] = exp2f(s[j][2] - n1);
        s[j][3] = exp2f(s[j][3] - n1);
        sum0 += s[j][0] + s[j][1];
        sum1 += s[j][2] + s[j][3];
      }
      l0 = l0 * a0 + sum0;
      l1 = l1 * a1 + sum1;
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        o[j][0] *= a0;
        o[j][1] *= a0;
        o[j][2] *= a1;
        o[j][3] *= a1;
      }
      // O += P V: P's A fragment for keys 16 kk.. is S's C fragments of key tiles 2 kk, 2 kk + 1.
#pragma unroll
      for (int kk = 0; kk < kBlockK / 16; ++kk) {
        const unsigned pa[4] = {pack_half2(s[2 * kk][0], s[2 * kk][1]),
                                pack_half2(s[2 * kk][2], s[2 * kk][3]),
                                pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          unsigned b[4];  // transposed: keys (+0 | +8) x dims (+0 | +8)
          ldsm_x4_trans(b, vt + (kk * 16 + (mi & 1) * 8 + mr) * S + dp * 16 + (mi >> 1) * 8);
          mma16816(o[2 * dp], pa, b[0], b[1]);
          mma16816(o[2 * dp + 1], pa, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // this buffer is restaged two iterations on
  }

#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
  const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
  const int r0 = warp * 16 + g, r1 = r0 + 8;
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    const int c = j * 8 + 2 * t;
    if (r0 < tile_rows)
      *reinterpret_cast<half2*>(out + r0 * row_stride + c) =
          __floats2half2_rn(o[j][0] * inv0, o[j][1] * inv0);
    if (r1 < tile_rows)
      *reinterpret_cast<half2*>(out + r1 * row_stride + c) =
          __floats2half2_rn(o[j][2] * inv1, o[j][3] * inv1);
  }
}

}  // namespace gyre::cuda::flash_attn
