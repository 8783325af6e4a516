// Prefill attention on tensor cores (flash-attention style), for head dims 64/80/96/128:
//   grid (query tiles of 64, query heads). Each of the 4 warps owns 16 query rows. Per tile of
//   64 keys (K and V staged in shared memory, 16-byte loads): S = Q K^T with WMMA (FP16 in, f32
//   accumulate), a warp-level online softmax over S in shared memory (causal and sliding-window
//   masks, running max/sum per row), then O += P V with WMMA into f32 accumulators kept in
//   shared memory (WMMA fragments have no defined row mapping, so the per-row rescale of O is
//   done there). Positions come from the device (*pos0) like the other attention kernel.
// Layout: q/out [n, n_heads * D]; cache [kv_head][max_seq][D] per layer (written beforehand).
// Softmax rows are walked by the whole warp (lanes across keys) and shared-memory rows are
// padded: the first version (lane pairs per row, unpadded rows) hit 16-way bank conflicts and
// ran at ~8 TFLOP/s (4.4 ms per Llama-3-8B layer at 2048 tokens, ncu).
// Alternatives: the scalar split kernel (attention.cu) is the fallback for other head dims and
// for few queries; it ran 2048-token prefill at about 7 TFLOP/s on H100. Not yet tried: wgmma,
// register-resident accumulators (mma.sync with a known fragment layout), K/V double buffering.
#include <mma.h>

#include <cfloat>

#include "backend/cuda/kv_quant.cuh"
#include "backend/cuda/launch.h"

namespace gyre::cuda {

namespace {

using namespace nvcuda;

constexpr int kBlockQ = 64, kBlockK = 64, kWarps = 4, kThreads = kWarps * 32;

// Dims c..c+7 of a quantized row as 8 halves (one 16-byte shared-memory store).
template <int T>
__device__ __forceinline__ uint4 dequant8_as_half(const KvRow& r, int c) {
  float f[8];
  kv_load8<T>(r, c, f);
  uint4 out;
  half2* h2 = reinterpret_cast<half2*>(&out);
#pragma unroll
  for (int e = 0; e < 4; ++e) h2[e] = __floats2half2_rn(f[2 * e], f[2 * e + 1]);
  return out;
}

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

template <int D, int T>
__global__ void __launch_bounds__(kThreads) flash_prefill_kernel(AttentionArgs a) {
  pdl_begin();
  extern __shared__ __align__(128) unsigned char smem[];
  using L = Smem<D>;
  half* q_s = reinterpret_cast<half*>(smem + L::q);
  half* k_s = reinterpret_cast<half*>(smem + L::k);
  half* v_s = reinterpret_cast<half*>(smem + L::v);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float* s_w = reinterpret_cast<float*>(smem + L::s) + warp * 16 * L::ss;
  half* p_w = reinterpret_cast<half*>(smem + L::p) + warp * 16 * L::ps;
  float* o_w = reinterpret_cast<float*>(smem + L::o) + warp * 16 * L::os;

  const int head = blockIdx.y, kvh = head / (a.n_heads / a.n_kv_heads);
  const int q0 = blockIdx.x * kBlockQ;
  const int pos0 = *a.pos0;
  const int64_t row_stride = static_cast<int64_t>(a.n_heads) * D;

  // Q tile (rows past n_q are zero) and zeroed accumulators.
  for (int i = tid; i < kBlockQ * D / 8; i += kThreads) {
    const int r = i / (D / 8), c = (i % (D / 8)) * 8;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (q0 + r < a.n_q)
      val = *reinterpret_cast<const uint4*>(a.q + (q0 + r) * row_stride + head * D + c);
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
  const int row_pos0 = pos0 + q0 + warp * 16;

  const int last_pos = pos0 + min(a.n_q, q0 + kBlockQ) - 1;
  int first_key = 0;
  if (a.window > 0) first_key = max(0, pos0 + q0 - a.window + 1) / kBlockK * kBlockK;
  const int64_t row0 = static_cast<int64_t>(kvh) * a.max_seq;
  const half* kbase = static_cast<const half*>(a.k_cache) + row0 * D;
  const half* vbase = static_cast<const half*>(a.v_cache) + row0 * D;

  for (int k0 = first_key; k0 <= last_pos; k0 += kBlockK) {
    __syncthreads();  // previous tile fully consumed (and Q/O initialised on the first pass)
    for (int i = tid; i < kBlockK * D / 8; i += kThreads) {
      const int r = i / (D / 8), c = (i % (D / 8)) * 8;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      if (k0 + r <= last_pos) {
        if constexpr (T == kKvF16) {
          kv = *reinterpret_cast<const uint4*>(kbase + static_cast<int64_t>(k0 + r) * D + c);
          vv = *reinterpret_cast<const uint4*>(vbase + static_cast<int64_t>(k0 + r) * D + c);
        } else {  // dequantized into the FP16 tile: the tensor-core part is unchanged
          kv = dequant8_as_half<T>(kv_row<T>(a.k_cache, a.k_params, row0 + k0 + r, D), c);
          vv = dequant8_as_half<T>(kv_row<T>(a.v_cache, a.v_params, row0 + k0 + r, D), c);
        }
      }
      *reinterpret_cast<uint4*>(k_s + r * L::qs + c) = kv;
      *reinterpret_cast<uint4*>(v_s + r * L::qs + c) = vv;
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
      const bool ok0 = key0 <= pos && (a.window <= 0 || key0 > pos - a.window);
      const bool ok1 = key1 <= pos && (a.window <= 0 || key1 > pos - a.window);
      const float v0 = ok0 ? srow[lane] * a.scale : -INFINITY;
      const float v1 = ok1 ? srow[lane + 32] * a.scale : -INFINITY;
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
    const int q = q0 + warp * 16 + r;
    if (q >= a.n_q) break;
    const float inv = l_r[r] > 0.0f ? 1.0f / l_r[r] : 0.0f;
    half* dst = a.out + q * row_stride + head * D;
    for (int d = lane; d < D; d += 32) dst[d] = __float2half(o_w[r * L::os + d] * inv);
  }
}

template <int D, int T>
void launch_flash(const AttentionArgs& a, cudaStream_t s) {
  const size_t bytes = Smem<D>::bytes;
  static bool configured = false;  // the attribute is per function; setting it once is enough
  if (!configured) {
    GYRE_CUDA_CHECK(cudaFuncSetAttribute(flash_prefill_kernel<D, T>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(bytes)));
    configured = true;
  }
  const dim3 grid(static_cast<unsigned>((a.n_q + kBlockQ - 1) / kBlockQ),
                  static_cast<unsigned>(a.n_heads));
  launch(flash_prefill_kernel<D, T>, grid, kThreads, bytes, s, a);
  GYRE_CUDA_LAUNCHED();
}

}  // namespace

bool flash_prefill_supported(int head_dim) {
  return head_dim == 64 || head_dim == 80 || head_dim == 96 || head_dim == 128;
}

template <int T>
void flash_prefill_typed(const AttentionArgs& a, cudaStream_t s) {
  switch (a.head_dim) {
    case 64:
      launch_flash<64, T>(a, s);
      break;
    case 80:
      launch_flash<80, T>(a, s);
      break;
    case 96:
      launch_flash<96, T>(a, s);
      break;
    case 128:
      launch_flash<128, T>(a, s);
      break;
    default:
      fail("flash_prefill: unsupported head_dim ", a.head_dim);
  }
}

void flash_prefill(const AttentionArgs& a, cudaStream_t s) {
  if (a.kv_type == kKvQ8)
    flash_prefill_typed<kKvQ8>(a, s);
  else if (a.kv_type == kKvQ4)
    flash_prefill_typed<kKvQ4>(a, s);
  else
    flash_prefill_typed<kKvF16>(a, s);
}

}  // namespace gyre::cuda
