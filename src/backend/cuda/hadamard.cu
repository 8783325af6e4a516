// Random-sign block Hadamard rotation of activations (hadamard_device.h), for the matmuls that do
// not rotate x in their own staging (prefill GEMMs, 8-bit and mixed weights, 4-bit at n > 2).
// Blocks up to kHadamardWarpMaxBlock: one warp per B-block, the values in registers and the
// butterflies through shuffles (hadamard_warp.cuh), no barriers: the earlier one-thread-per-
// element kernel below synchronised its CTA twice per stage, which cost prefill 14% on
// Llama-3-8B shapes (docs/quantization.md). Larger blocks (to kHadamardMaxBlock) keep that
// kernel: a CTA of E = max(256, B) elements (whole B-blocks), the log2(B) stages in shared
// memory, thread i keeping the sum (bit h of i clear) or the difference (set) of (i, i ^ h).
#include <cstdlib>
#include <string>

#include "backend/cuda/hadamard_device.h"
#include "backend/cuda/hadamard_warp.cuh"
#include "backend/cuda/launch.h"

namespace gyre::cuda {

namespace {

constexpr int kMinThreads = 256;
constexpr int kWarpKernelWarps = 8;

template <int E>
__global__ void __launch_bounds__(kWarpKernelWarps * 32)
    hadamard_rotate_warp_kernel(half* out, const half* x, const int8_t* signs, int64_t blocks,
                                int cols, float scale) {
  pdl_begin();
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpKernelWarps + (threadIdx.x >> 5);
  if (item >= blocks) return;  // whole warps leave: the shuffles below see full warps
  const int64_t e0 = item * (32 * E) + (threadIdx.x & 31) * E;
  float v[1][E];
  load_signed<E>(x + e0, signs + e0 % cols, v[0]);
  warp_fwht<E>(v);
  store_scaled<E>(out + e0, v[0], scale);
}

__global__ void hadamard_rotate_kernel(half* out, const half* x, const int8_t* signs, int64_t total,
                                       int cols, int block, float scale) {
  pdl_begin();
  extern __shared__ float buf[];
  const int i = threadIdx.x;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + i;
  const bool live = e < total;  // a last, partial CTA holds whole blocks; the rest idle along
  buf[i] = live ? __half2float(x[e]) * static_cast<float>(signs[e % cols]) : 0.0f;
  __syncthreads();
  for (int h = 1; h < block; h *= 2) {
    const float mine = buf[i], other = buf[i ^ h];
    __syncthreads();
    buf[i] = (i & h) ? other - mine : mine + other;
    __syncthreads();
  }
  if (live) out[e] = __float2half(buf[i] * scale);
}

template <int E>
void launch_warp_kernel(half* out, const half* x, const int8_t* signs, int64_t blocks, int cols,
                        float scale, cudaStream_t s) {
  const int64_t ctas = (blocks + kWarpKernelWarps - 1) / kWarpKernelWarps;
  GYRE_CHECK(ctas < (int64_t{1} << 31), "CUDA hadamard_rotate: input too large");
  launch(hadamard_rotate_warp_kernel<E>, dim3(static_cast<unsigned>(ctas)),
         dim3(kWarpKernelWarps * 32), 0, s, out, x, signs, blocks, cols, scale);
}

}  // namespace

void hadamard_rotate(half* out, const half* x, const int8_t* signs, int64_t n, int cols, int block,
                     cudaStream_t s) {
  GYRE_CHECK(block >= 2 && block <= kHadamardMaxBlock && (block & (block - 1)) == 0 && cols > 0 &&
                 cols % block == 0,
             "CUDA hadamard_rotate: block ", block, " does not fit ", cols, " columns");
  if (n <= 0) return;
  const float scale = 1.0f / sqrtf(static_cast<float>(block));
  const int64_t total = n * cols;
  // The warp kernel's vector accesses need 16-byte aligned rows (every backend activation is).
  const bool aligned =
      (reinterpret_cast<uintptr_t>(out) | reinterpret_cast<uintptr_t>(x)) % 16 == 0;
  // GYRE_HADAMARD_WARP=0: the shared-memory kernel for every block (an A/B knob).
  static const bool warp_kernel = [] {
    const char* e = std::getenv("GYRE_HADAMARD_WARP");
    return e == nullptr || std::string(e) != "0";
  }();
  if (warp_kernel && aligned && block >= 32 && block <= kHadamardWarpMaxBlock) {
    const int64_t blocks = total / block;
    switch (block) {
      case 32:
        return launch_warp_kernel<1>(out, x, signs, blocks, cols, scale, s);
      case 64:
        return launch_warp_kernel<2>(out, x, signs, blocks, cols, scale, s);
      case 128:
        return launch_warp_kernel<4>(out, x, signs, blocks, cols, scale, s);
      default:
        return launch_warp_kernel<8>(out, x, signs, blocks, cols, scale, s);
    }
  }
  const int threads = block > kMinThreads ? block : kMinThreads;
  const int64_t ctas = (total + threads - 1) / threads;
  GYRE_CHECK(ctas < (int64_t{1} << 31), "CUDA hadamard_rotate: input too large");
  launch(hadamard_rotate_kernel, dim3(static_cast<unsigned>(ctas)), dim3(threads),
         threads * sizeof(float), s, out, x, signs, total, cols, block, scale);
}

}  // namespace gyre::cuda
