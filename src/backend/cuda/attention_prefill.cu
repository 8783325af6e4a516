// Prefill attention on tensor cores (flash-attention style), for head dims 64/80/96/128:
//   grid (query tiles of 64, query heads); each block runs flash_tile (attention_flash.cuh,
//   shared with the paged cache). Positions come from the device (*pos0) like the other
//   attention kernel.
// Layout: q/out [n, n_heads * D]; cache [kv_head][max_seq][D] per layer (written beforehand).
// Alternatives: the scalar split kernel (attention.cu) is the fallback for other head dims and
// for few queries; it ran 2048-token prefill at about 7 TFLOP/s on H100. Not yet tried: wgmma,
// register-resident accumulators (mma.sync with a known fragment layout), K/V double buffering.
#include "backend/cuda/attention_flash.cuh"

namespace gyre::cuda {

namespace {

using namespace flash_attn;

struct ContiguousKv {
  const half *k, *v;
  int64_t base;  // kv_head * max_seq * D
  int D;
  __device__ int64_t row(int j) const { return base + static_cast<int64_t>(j) * D; }
};

template <int D>
__global__ void __launch_bounds__(kThreads) flash_prefill_kernel(AttentionArgs a) {
  pdl_begin();
  const int head = blockIdx.y, kvh = head / (a.n_heads / a.n_kv_heads);
  const int q0 = blockIdx.x * kBlockQ;
  const int64_t row_stride = static_cast<int64_t>(a.n_heads) * D;
  const ContiguousKv kv{a.k_cache, a.v_cache, static_cast<int64_t>(kvh) * a.max_seq * D, D};
  const int64_t first = q0 * row_stride + head * D;
  flash_tile<D>(kv, a.q + first, a.out + first, row_stride, a.n_q - q0, *a.pos0 + q0, a.window,
                a.scale);
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
