// How the stream decode GEMV (qlinear_stream.cuh) stages x in shared memory before its weight
// loop: the rows (gathered or scattered through an act-order permutation), the fused RMSNorm
// and a rotated layer's R^T, plus the cp.async helpers and the dynamic shared memory this takes.
#pragma once

#include "backend/cuda/hadamard_warp.cuh"
#include "backend/cuda/qlinear_kernels.cuh"

namespace gyre::qlinear_detail {

constexpr int kStreamXPad =
    32;  // halves after each staged x row: rows 64 bytes apart mod 128 banks

__host__ __device__ inline int act_order_smem(const Params& p);

// Dynamic shared memory of the staged x for n tokens, then a rotated layer's signs (cols bytes, a
// multiple of 32) and, with the norm fused, the norm weights (cols halves); or an act-order
// weight's (never rotated) gather space (act_order_smem).
__host__ __device__ inline int stream_smem(const Params& p) {
  return p.n * (p.kblocks * 64 + kStreamXPad) * 2 +
         (p.had_block > 0 ? p.cols * (p.norm_w != nullptr ? 3 : 1) : 0) + act_order_smem(p);
}

// The norm weights the rotation pass reads: staged in shared memory (norm_s) when 16-byte aligned,
// else from global memory.
__device__ __forceinline__ bool stream_norm_staged(const Params& p) {
  return p.norm_w != nullptr && reinterpret_cast<uintptr_t>(p.norm_w) % 16 == 0;
}

// bytes (a multiple of 16, both addresses 16-byte aligned) by cp.async, this thread's share.
__device__ __forceinline__ void copy_async(void* dst, const void* src, int bytes) {
  for (int i = threadIdx.x * 16; i < bytes; i += blockDim.x * 16) {
    const unsigned addr =
        static_cast<unsigned>(__cvta_generic_to_shared(static_cast<char*>(dst) + i));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(addr),
                 "l"(static_cast<const char*>(src) + i)
                 : "memory");
  }
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(addr), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(addr), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__host__ __device__ inline int stream_smem_aligned(const Params& p) {
  return (stream_smem(p) + 15) / 16 * 16;
}

// A rotated layer's signs [cols] (and the fused norm's weights) into shared memory by cp.async,
// issued before the PDL wait (they are weights, not the previous kernel's output) and awaited
// with the x staging, so that the rotation pass reads them at shared-memory latency instead of
// waiting on L2 in every step. The signs are 16-byte aligned (qlinear_fuses_rotation checks).
__device__ __forceinline__ void stage_rotation_async(const Params& p, int8_t* signs,
                                                     __half* norm_s) {
  copy_async(signs, p.had_signs, p.cols);
  if (stream_norm_staged(p)) copy_async(norm_s, p.norm_w, 2 * p.cols);
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// Lane's E values of staged row `src` at column c, normalised (nw set: exactly as
// stage_stream_x's norm pass rounds them) and times the signs.
template <int E>
__device__ __forceinline__ void rotation_input(const __half* src, const int8_t* signs,
                                               const __half* nw, float inv_rms, int c,
                                               float (&v)[E]) {
  using Vec = typename cuda::HalfVec<E>::T;
  const Vec raw = *reinterpret_cast<const Vec*>(src);
  __half h[E];
  memcpy(h, &raw, sizeof(h));
  if (nw != nullptr) {
#pragma unroll
    for (int k = 0; k < E; ++k)
      h[k] = __float2half(__half2float(h[k]) * inv_rms * __half2float(nw[c + k]));
  }
#pragma unroll
  for (int k = 0; k < E; ++k) v[k] = __half2float(h[k]) * static_cast<float>(signs[c + k]);
}

// R^T x on the staged rows, in place: each warp takes M (token, B-block) items per pass (M = 2:
// their shuffle chains overlap); with the norm fused (nw: its weights) each value is first
// normalised (stage_stream_x's norm pass does not run then). B = 32 E. The weight ring stays live
// across this pass, so its registers add to the kernel's count (ptxas, gemv_stream_kernel<4, 1, 4>:
// M = 1 keeps 64 registers at g32 and asymmetric g128 where M = 2 took 64 + spills and 80).
constexpr int kRotateItems = 1;
template <int E, int M>
__device__ __forceinline__ void rotate_stream_x(const Params& p, __half* xs, int stride,
                                                const int8_t* signs, const __half* nw,
                                                const float* norm_sum) {
  const int per_row = p.cols / (32 * E), items = p.n * per_row;
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  for (int a = threadIdx.x >> 5; a < items; a += M * warps) {
    __half* dst[M];
    bool live[M];
    float v[M][E];
#pragma unroll
    for (int i = 0; i < M; ++i) {
      live[i] = a + i * warps < items;  // warp-uniform; a dead item repeats a, not stored
      const int item = live[i] ? a + i * warps : a, tok = item / per_row;
      const int col = (item - tok * per_row) * 32 * E + lane * E;
      dst[i] = xs + tok * stride + col;
      const float inv_rms =
          nw != nullptr ? rsqrtf(norm_sum[tok] / static_cast<float>(p.cols) + p.norm_eps) : 0.f;
      rotation_input<E>(dst[i], signs, nw, inv_rms, col, v[i]);
    }
    cuda::warp_fwht<E, M>(v);
#pragma unroll
    for (int i = 0; i < M; ++i)
      if (live[i]) cuda::store_scaled<E>(dst[i], v[i], p.had_scale);
  }
}

// Whether act-order weights of this width stage x by scattering it through inv_perm
// (scatter_stream_rows, kernel AO = 2) rather than gathering it through perm from a copy of the
// rows (AO = 0). Both the staging space (act_order_smem) and the kernel choice
// (launch_stream_kernel) follow this one rule.
__host__ __device__ constexpr bool stream_act_order_scatters(int bits) {
  return bits == 4;
}

// Shared memory an act-order weight's staging needs after the staged rows (stream_smem): with the
// norm fused, its weights in the weight's column order, then (gathering widths only) the rows as
// they come (K = the padded columns, halves each).
__host__ __device__ inline int act_order_smem(const Params& p) {
  if (p.perm == nullptr) return 0;
  const int k = p.kblocks * 64;
  return (p.norm_w != nullptr ? k * 2 : 0) + (stream_act_order_scatters(p.bits) ? 0 : p.n * k * 2);
}

// Entries c..c+7 of a [cols] index array (two 16-byte loads when all are in range; -1 past cols).
__device__ __forceinline__ void load_indices8(const int32_t* a, int c, int cols, int (&out)[8]) {
  if (c + 8 <= cols) {
    const int4 lo = __ldg(reinterpret_cast<const int4*>(a + c));
    const int4 hi = __ldg(reinterpret_cast<const int4*>(a + c + 4));
    out[0] = lo.x, out[1] = lo.y, out[2] = lo.z, out[3] = lo.w;
    out[4] = hi.x, out[5] = hi.y, out[6] = hi.z, out[7] = hi.w;
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = c + k < cols ? __ldg(a + c + k) : -1;
  }
}

// An act-order weight's x (and, with the norm fused, the norm weights, into nws) gathered through
// perm into its column order. The rows are first copied as they come into shared memory (16-byte
// loads) and gathered there, where a warp's 32 scattered 2-byte reads cost a few bank wavefronts
// rather than up to 32 L1 wavefronts from global memory; the norm weights are gathered from
// global memory in the same pass (their copy too would cost q|k|v and gate|up a block per SM).
// Each thread loads its chunk's 8 indices with two 16-byte loads. Session 15, 4-bit act-order
// decode of the Llama-3-8B shape: 358 tok/s with a dependent load pair per value, 375 with vector
// indices, 369 with both the rows and the norm weights copied (a block per SM less). Adds this
// thread's sums of squares per token into ss (norm_w set); the caller reduces them.
__device__ __forceinline__ void gather_stream_rows(const Params& p, __half* xs, int stride,
                                                   __half* nws, float (&ss)[8]) {
  const int k_cols = p.kblocks * 64, chunks = k_cols / 8;
  __half* raw = p.norm_w != nullptr ? nws + k_cols : nws;
  for (int tok = 0; tok < p.n; ++tok) {
    const __half* src = p.x + int64_t{tok} * p.cols;
    for (int i = threadIdx.x; i < chunks; i += blockDim.x) {
      const int c = i * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (c + 8 <= p.cols && p.cols % 8 == 0) {
        v = __ldg(reinterpret_cast<const uint4*>(src + c));
      } else if (c < p.cols) {
        __half h[8];
        for (int k = 0; k < 8; ++k) h[k] = c + k < p.cols ? src[c + k] : __float2half(0.f);
        memcpy(&v, h, 16);
      }
      *reinterpret_cast<uint4*>(raw + tok * k_cols + c) = v;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < chunks; i += blockDim.x) {
    const int c = i * 8;
    int idx[8];
    load_indices8(p.perm, c, p.cols, idx);
    if (p.norm_w != nullptr) {
      __half w[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) w[k] = idx[k] >= 0 ? p.norm_w[idx[k]] : __float2half(0.f);
      memcpy(nws + c, w, 16);
    }
#pragma unroll
    for (int tok = 0; tok < 8; ++tok) {  // unrolled: ss stays in registers
      if (tok >= p.n) continue;
      const __half* row = raw + tok * k_cols;
      __half h[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) h[k] = idx[k] >= 0 ? row[idx[k]] : __float2half(0.f);
      if (p.norm_w != nullptr) {
#pragma unroll
        for (int k = 0; k < 8; ++k) ss[tok] += __half2float(h[k]) * __half2float(h[k]);
      }
      memcpy(xs + tok * stride + c, h, 16);
    }
  }
}

// The 4-bit act-order staging (gemv_stream_kernel's AO = 2): each thread loads its chunks of x
// as they come (16-byte loads, as the plain staging does) and stores each value where the
// weight's column order wants it, xs[inv_perm[c]]; with the norm fused, the norm weights go to
// nws the same way. So the staging keeps the plain one's shape (no copy of the rows, no barrier
// between a copy and a gather, no index loads that wait for one): x, the inverse indices and the
// norm weights are all requested at once, and the stores are 2-byte shared-memory scatters.
// Adds this thread's sums of squares per token into ss (norm_w set; order does not matter).
// Session 16, H100, Llama-3-8B shape: the gather of session 15 cost 4-bit decode 470 -> 407 tok/s.
__device__ __forceinline__ void scatter_stream_rows(const Params& p, __half* xs, int stride,
                                                    __half* nws, float (&ss)[8]) {
  const int k_cols = p.kblocks * 64, chunks = k_cols / 8;
  for (int tok = 0; tok < p.n; ++tok)  // padding columns: no input column lands there
    for (int c = p.cols + threadIdx.x; c < k_cols; c += blockDim.x)
      xs[tok * stride + c] = __float2half(0.f);
  for (int i = threadIdx.x; i < chunks && i * 8 < p.cols; i += blockDim.x) {
    const int c = i * 8;
    const bool whole = c + 8 <= p.cols;
    int dst[8];
    load_indices8(p.inv_perm, c, p.cols, dst);
    if (p.norm_w != nullptr) {
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if (dst[k] >= 0) nws[dst[k]] = p.norm_w[c + k];
    }
#pragma unroll
    for (int tok = 0; tok < 8; ++tok) {  // unrolled: ss stays in registers
      if (tok >= p.n) continue;
      const __half* src = p.x + int64_t{tok} * p.cols;
      __half h[8];
      if (whole && p.cols % 8 == 0) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(src + c));
        memcpy(h, &v, 16);
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) h[k] = c + k < p.cols ? src[c + k] : __float2half(0.f);
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        if (dst[k] < 0) continue;
        if (p.norm_w != nullptr) ss[tok] += __half2float(h[k]) * __half2float(h[k]);
        xs[tok * stride + dst[k]] = h[k];
      }
    }
  }
}

__device__ __forceinline__ float sum_squares8(uint4 v) {
  const uint32_t w4[4] = {v.x, v.y, v.z, v.w};
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __half22float2(as_half2(w4[k]));
    s += f.x * f.x + f.y * f.y;
  }
  return s;
}

// A block-wide barrier. ALIGNED = false: the non-aligned form, which the warps of a block may
// reach from different places in the code (the two-part kernel's warps stage x in the branch of
// their part, qlinear_mixed_stream.cu); __syncthreads requires one place for the whole block.
template <bool ALIGNED>
__device__ __forceinline__ void block_sync() {
  if constexpr (ALIGNED)
    __syncthreads();
  else
    asm volatile("barrier.sync 0;" ::: "memory");
}

// The fused norm's weights for this thread's first two 8-column chunks of x, loaded before the
// PDL wait (they are weights, not the previous kernel's output), so that the norm pass after the
// staging's barrier reads registers instead of waiting on L2 (stage_stream_x; none for act-order
// or rotated weights, whose passes read the weights elsewhere).
struct NormAhead {
  uint4 w[2];
  bool valid = false;
};
__device__ __forceinline__ NormAhead norm_ahead(const Params& p) {
  NormAhead a;
  a.valid = p.norm_ahead && p.norm_w != nullptr && p.perm == nullptr && p.had_block == 0 &&
            reinterpret_cast<uintptr_t>(p.norm_w) % 16 == 0;
  if (a.valid) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int c = (threadIdx.x + j * blockDim.x) * 8;
      a.w[j] = c + 8 <= p.cols ? __ldg(reinterpret_cast<const uint4*>(p.norm_w + c))
                               : make_uint4(0, 0, 0, 0);
    }
  }
  return a;
}

// x rows 0..n-1 into xs (columns padded to whole blocks with zeros, gathered through perm), then
// (norm_w set) each row scaled by its RMS norm exactly as the rmsnorm kernel rounds it, then
// (had_block set; signs staged by stage_signs_async) rotated by R^T.
// AO: 0 = act-order or not as p.perm says, 1 = never, 2 = always (gemv_stream_kernel's AO).
// ALIGNED: block_sync's; false only with AO = 1 and no rotation (whose passes keep __syncthreads).
// ahead: the norm weights norm_ahead loaded (nullptr: read them here).
template <int AO, bool ALIGNED = true>
__device__ __forceinline__ void stage_stream_x(const Params& p, __half* xs, int stride,
                                               const int8_t* signs, const __half* norm_s,
                                               const NormAhead* ahead = nullptr) {
  static_assert(ALIGNED || AO == 1, "the non-aligned staging has no act-order pass");
  const int lane = threadIdx.x & 31;
  const bool act = AO == 2 || (AO == 0 && p.perm != nullptr);  // an act-order weight
  const int chunks = p.kblocks * 64 / 8;
  __shared__ float norm_sum[8];
  if (p.norm_w != nullptr && threadIdx.x < 8) norm_sum[threadIdx.x] = 0.f;
  if (p.norm_w != nullptr) block_sync<ALIGNED>();
  // Act-order weights (never rotated): the gather space follows the staged rows.
  __half* nws = xs + p.n * stride;
  if (act) {
    float ss[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if constexpr (AO == 2)
      scatter_stream_rows(p, xs, stride, nws, ss);
    else
      gather_stream_rows(p, xs, stride, nws, ss);
    if (p.norm_w != nullptr) {
#pragma unroll
      for (int tok = 0; tok < 8; ++tok) {
        if (tok >= p.n) continue;
        float v = ss[tok];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) atomicAdd(&norm_sum[tok], v);
      }
    }
  }
  for (int tok = 0; tok < p.n && !act; ++tok) {  // act-order: gathered above
    const __half* row = p.x + int64_t{tok} * p.cols;
    float ss = 0.f;
    for (int i = threadIdx.x; i < chunks; i += blockDim.x) {
      const int c = i * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (c + 8 <= p.cols) {
        v = __ldg(reinterpret_cast<const uint4*>(row + c));
      } else if (c < p.cols) {
        __half h[8];
        for (int k = 0; k < 8; ++k) h[k] = c + k < p.cols ? row[c + k] : __float2half(0.f);
        memcpy(&v, h, 16);
      }
      if (p.norm_w != nullptr && p.x_cols == 0) ss += sum_squares8(v);
      *reinterpret_cast<uint4*>(xs + tok * stride + c) = v;
    }
    if (p.norm_w != nullptr && p.x_cols > 0) {  // over the whole shared row, x at x_offset of it
      const __half* whole = row - p.x_offset;
      for (int c = threadIdx.x * 8; c < p.x_cols; c += blockDim.x * 8)
        ss += sum_squares8(__ldg(reinterpret_cast<const uint4*>(whole + c)));
    }
    if (p.norm_w != nullptr) {
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (lane == 0) atomicAdd(&norm_sum[tok], ss);
    }
  }
  if (ALIGNED && p.had_block > 0) {  // the two-part kernel takes no rotated part
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    const __half* nw = stream_norm_staged(p) ? norm_s : p.norm_w;
    switch (p.had_block) {
      case 32:
        rotate_stream_x<1, kRotateItems>(p, xs, stride, signs, nw, norm_sum);
        break;
      case 64:
        rotate_stream_x<2, kRotateItems>(p, xs, stride, signs, nw, norm_sum);
        break;
      case 128:
        rotate_stream_x<4, kRotateItems>(p, xs, stride, signs, nw, norm_sum);
        break;
      default:
        rotate_stream_x<8, kRotateItems>(p, xs, stride, signs, nw, norm_sum);
    }
    __syncthreads();
    return;
  }
  block_sync<ALIGNED>();
  if (p.norm_w != nullptr) {
    for (int tok = 0; tok < p.n; ++tok) {
      const float inv_rms = rsqrtf(
          norm_sum[tok] / static_cast<float>(p.norm_cols > 0 ? p.norm_cols : p.cols) + p.norm_eps);
      for (int i = threadIdx.x, j = 0; i < chunks; i += blockDim.x, ++j) {
        const int c = i * 8;
        if (c >= p.cols) continue;
        __half h[8];
        memcpy(h, xs + tok * stride + c, 16);
        if (ahead != nullptr && ahead->valid && j < 2 && c + 8 <= p.cols) {
          const uint4 wv = j == 0 ? ahead->w[0] : ahead->w[1];  // registers, not an indexed array
          __half w[8];
          memcpy(w, &wv, 16);
#pragma unroll
          for (int k = 0; k < 8; ++k)
            h[k] = __float2half(__half2float(h[k]) * inv_rms * __half2float(w[k]));
        } else {
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            const int cc = c + k;
            if (cc < p.cols) {
              const float w = __half2float(act ? nws[cc] : p.norm_w[cc]);
              h[k] = __float2half(__half2float(h[k]) * inv_rms * w);
            }
          }
        }
        memcpy(xs + tok * stride + c, h, 16);
      }
    }
    block_sync<ALIGNED>();
  }
}

}  // namespace gyre::qlinear_detail
