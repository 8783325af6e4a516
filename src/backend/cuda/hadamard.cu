// Random-sign block Hadamard rotation of activations (hadamard_device.h). A CTA takes
// E = max(256, B) consecutive elements of the flattened [n, cols] input (whole B-blocks, since
// cols is a multiple of B and B divides E or E = B), one per thread, and runs the log2(B)
// butterfly stages in shared memory: at stage h thread i reads its pair (i, i ^ h) and keeps
// the sum (bit h clear) or the difference (bit h set). Memory bound and tiny next to the GEMV
// that follows (a decode row of 4096 columns is 8 KB); the fused version folds it into the
// GEMV's staging of x.
#include "backend/cuda/hadamard_device.h"
#include "backend/cuda/launch.h"

namespace gyre::cuda {

namespace {

constexpr int kMinThreads = 256;

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

}  // namespace

void hadamard_rotate(half* out, const half* x, const int8_t* signs, int64_t n, int cols, int block,
                     cudaStream_t s) {
  GYRE_CHECK(block >= 2 && block <= kHadamardMaxBlock && (block & (block - 1)) == 0 && cols > 0 &&
                 cols % block == 0,
             "CUDA hadamard_rotate: block ", block, " does not fit ", cols, " columns");
  if (n <= 0) return;
  const int threads = block > kMinThreads ? block : kMinThreads;
  const int64_t total = n * cols;
  const int64_t ctas = (total + threads - 1) / threads;
  GYRE_CHECK(ctas < (int64_t{1} << 31), "CUDA hadamard_rotate: input too large");
  launch(hadamard_rotate_kernel, dim3(static_cast<unsigned>(ctas)), dim3(threads),
         threads * sizeof(float), s, out, x, signs, total, cols, block,
         1.0f / sqrtf(static_cast<float>(block)));
}

}  // namespace gyre::cuda
