// Prefill attention on tensor cores (flash-attention style), for head dims 64/80/96/128:
//   grid (query tiles of 64, query heads). Each of the 4 warps owns 16 query rows. Per tile of
//   64 keys (K and V staged in shared memory, 16-byte loads): S = Q K^T with WMMA (FP16 in, f32
//   accumulate), a warp-level online softmax over S in shared memory (causal and sliding-window
//   masks, running max/sum per row), then O += P V with WMMA into f32 accumulators kept in
//   shared memory (WMMA fragments have no defined row mapping, so the per-row rescale of O is
//   done there). Positions come from the device (*pos0) like the other attention kernel.
// Layout: q/out [n, n_heads * D]; cache [kv_head][max_seq][D] per layer (written beforehand).
// Alternatives: the scalar split kernel (attention.cu) is the fallback for other head dims and
// for few queries; it ran 2048-token prefill at about 7 TFLOP/s on H100. Not yet tried: wgmma,
// register-resident accumulators (mma.sync with a known fragment layout), K/V double buffering.
#include <mma.h>

#include <cfloat>

#include "backend/cuda/launch.h"

namespace gyre::cuda {

namespace {

using namespace nvcuda;

constexpr int kBlockQ = 64, kBlockK = 64, kWarps = 4, kThreads = kWarps * 32;

template <int D>
struct Smem {
  static constexpr size_t q = 0;                              // half [64][D]
  static constexpr size_t k = q + kBlockQ * D * 2;            // half [64][D]
  static constexpr size_t v = k + kBlockK * D * 2;            // half [64][D]
  static constexpr size_t s = v + kBlockK * D * 2;            // float [4][16][64]
  static constexpr size_t p = s + kWarps * 16 * kBlockK * 4;  // half [4][16][64]
  static constexpr size_t o = p + kWarps * 16 * kBlockK * 2;  // float [4][16][D]
  static constexpr size_t bytes = o + kWarps * 16 * D * 4;
};

template <int D>
__global__ void __launch_bounds__(kThreads) flash_prefill_kernel(AttentionArgs a) {
  pdl_begin();
  extern __shared__ __align__(128) unsigned char smem[];
  using L = Smem<D>;
  half* q_s = reinterpret_cast<half*>(smem + L::q);
  half* k_s = reinterpret_cast<half*>(smem + L::k);
  half* v_s = reinterpret_cast<half*>(smem + L::v);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float* s_w = reinterpret_cast<float*>(smem + L::s) + warp * 16 * kBlockK;
  half* p_w = reinterpret_cast<half*>(smem + L::p) + warp * 16 * kBlockK;
  float* o_w = reinterpret_cast<float*>(smem + L::o) + warp * 16 * D;

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
    *reinterpret_cast<uint4*>(q_s + r * D + c) = val;
  }
  for (int i = lane; i < 16 * D; i += 32) o_w[i] = 0.0f;
  // Each lane pair owns one row of the warp's 16: lane/2 is the row, lane%2 the half of the keys.
  const int my_row = lane >> 1, my_half = lane & 1;
  const int my_pos = pos0 + q0 + warp * 16 + my_row;
  float m = -1e30f, l = 0.0f;

  const int last_pos = pos0 + min(a.n_q, q0 + kBlockQ) - 1;
  int first_key = 0;
  if (a.window > 0) first_key = max(0, pos0 + q0 - a.window + 1) / kBlockK * kBlockK;
  const half* kbase = a.k_cache + static_cast<int64_t>(kvh) * a.max_seq * D;
  const half* vbase = a.v_cache + static_cast<int64_t>(kvh) * a.max_seq * D;

  for (int k0 = first_key; k0 <= last_pos; k0 += kBlockK) {
    __syncthreads();  // previous tile fully consumed (and Q/O initialised on the first pass)
    for (int i = tid; i < kBlockK * D / 8; i += kThreads) {
      const int r = i / (D / 8), c = (i % (D / 8)) * 8;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      if (k0 + r <= last_pos) {
        kv = *reinterpret_cast<const uint4*>(kbase + static_cast<int64_t>(k0 + r) * D + c);
        vv = *reinterpret_cast<const uint4*>(vbase + static_cast<int64_t>(k0 + r) * D + c);
      }
      *reinterpret_cast<uint4*>(k_s + r * D + c) = kv;
      *reinterpret_cast<uint4*>(v_s + r * D + c) = vv;
    }
    __syncthreads();

    // S[16][64] = Q_w K^T
    for (int kt = 0; kt < kBlockK / 16; ++kt) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int kk = 0; kk < D / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> fb;
        wmma::load_matrix_sync(fa, q_s + warp * 16 * D + kk * 16, D);
        wmma::load_matrix_sync(fb, k_s + kt * 16 * D + kk * 16, D);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(s_w + kt * 16, acc, kBlockK, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax of this lane's 32 scores.
    float* srow = s_w + my_row * kBlockK + my_half * 32;
    float tile_max = -1e30f;
    for (int j = 0; j < 32; ++j) {
      const int key = k0 + my_half * 32 + j;
      const bool ok = key <= my_pos && (a.window <= 0 || key > my_pos - a.window);
      const float sv = ok ? srow[j] * a.scale : -INFINITY;
      srow[j] = sv;
      tile_max = fmaxf(tile_max, sv);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    const float alpha = __expf(m - m_new);
    float sum = 0.0f;
    half* prow = p_w + my_row * kBlockK + my_half * 32;
    for (int j = 0; j < 32; ++j) {
      const float pv = __expf(srow[j] - m_new);
      sum += pv;
      prow[j] = __float2half(pv);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * alpha + sum;
    m = m_new;
    float* orow = o_w + my_row * D + my_half * (D / 2);
    for (int d = 0; d < D / 2; ++d) orow[d] *= alpha;
    __syncwarp();

    // O_w[16][D] += P[16][64] V[64][D]
    for (int dt = 0; dt < D / 16; ++dt) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, o_w + dt * 16, D, wmma::mem_row_major);
      for (int kk = 0; kk < kBlockK / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> fb;
        wmma::load_matrix_sync(fa, p_w + kk * 16, kBlockK);
        wmma::load_matrix_sync(fb, v_s + kk * 16 * D + dt * 16, D);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(o_w + dt * 16, acc, D, wmma::mem_row_major);
    }
    __syncwarp();
  }

  const int q = q0 + warp * 16 + my_row;
  if (q < a.n_q) {
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    half* dst = a.out + q * row_stride + head * D + my_half * (D / 2);
    const float* src = o_w + my_row * D + my_half * (D / 2);
    for (int d = 0; d < D / 2; ++d) dst[d] = __float2half(src[d] * inv);
  }
}

template <int D>
void launch_flash(const AttentionArgs& a, cudaStream_t s) {
  const size_t bytes = Smem<D>::bytes;
  static bool configured = false;  // the attribute is per function; setting it once is enough
  if (!configured) {
    GYRE_CUDA_CHECK(cudaFuncSetAttribute(flash_prefill_kernel<D>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(bytes)));
    configured = true;
  }
  const dim3 grid(static_cast<unsigned>((a.n_q + kBlockQ - 1) / kBlockQ),
                  static_cast<unsigned>(a.n_heads));
  launch(flash_prefill_kernel<D>, grid, kThreads, bytes, s, a);
  GYRE_CUDA_LAUNCHED();
}

}  // namespace

bool flash_prefill_supported(int head_dim) {
  return head_dim == 64 || head_dim == 80 || head_dim == 96 || head_dim == 128;
}

void flash_prefill(const AttentionArgs& a, cudaStream_t s) {
  switch (a.head_dim) {
    case 64:
      launch_flash<64>(a, s);
      break;
    case 80:
      launch_flash<80>(a, s);
      break;
    case 96:
      launch_flash<96>(a, s);
      break;
    case 128:
      launch_flash<128>(a, s);
      break;
    default:
      fail("flash_prefill: unsupported head_dim ", a.head_dim);
  }
}

}  // namespace gyre::cuda
