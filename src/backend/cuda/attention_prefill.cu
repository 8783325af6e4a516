// Prefill attention on tensor cores (flash-attention style), for head dims 64/80/96/128:
//   grid (query tiles of 64, query heads); each block runs flash_tile (attention_flash.cuh,
//   shared with the paged cache). Positions come from the device (*pos0) like the other
//   attention kernel.
// Layout: q/out [n, n_heads * D]; cache rows [kv_head][max_seq] per layer (written beforehand),
// FP16 or q8/q4 (dequantized into the tile's shared memory, kv_quant.cuh).
// Alternatives: the scalar split kernel (attention.cu) is the fallback for other head dims and
// for few queries; it ran 2048-token prefill at about 7 TFLOP/s on H100. Not yet tried: wgmma
// with TMA-fed K/V (Hopper), 128-row query tiles.
#include "backend/cuda/attention_flash.cuh"

namespace gyre::cuda {

namespace {

using namespace flash_attn;

template <int D, int T>
__global__ void __launch_bounds__(kThreads) flash_prefill_kernel(AttentionArgs a) {
  pdl_begin();
  const int head = blockIdx.y, kvh = head / (a.n_heads / a.n_kv_heads);
  const int q0 = blockIdx.x * kBlockQ;
  const int64_t row_stride = static_cast<int64_t>(a.n_heads) * D;
  const int64_t first = q0 * row_stride + head * D;
  flash_tile<D, T>(contiguous_kv(a, kvh), a.q + first, a.out + first, row_stride, a.n_q - q0,
                   *a.pos0 + q0, a.window, a.scale);
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

void flash_prefill(const AttentionArgs& a, cudaStream_t s) {
  with_kv_kind(a.kv_type, [&](auto kind) {
    constexpr int T = decltype(kind)::value;
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
  });
}

}  // namespace gyre::cuda
