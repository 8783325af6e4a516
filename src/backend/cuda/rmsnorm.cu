// RMSNorm, optionally fused with the residual add before it:
//   residual += x (rounded to FP16, as the residual stream is stored); out = r / rms(r) * w.
// One block per row; the sum of squares is accumulated in f32 and reduced with warp shuffles.
// Layout: row-major [rows, cols] FP16. 1024 threads per block so a decode row (one block on one
// SM) is read in a single round of loads; a smaller block made the per-token latency worse.
#include "backend/cuda/cuda_common.h"

namespace gyre::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kMaxPerThread = 16;  // cols up to 16384 keep the row in registers

__global__ void __launch_bounds__(kThreads)
    rmsnorm_kernel(half* out, half* residual, const half* x, const half* w, int cols, float eps) {
  const int64_t row = blockIdx.x;
  const half* xr = x + row * cols;
  half* rr = residual ? residual + row * cols : nullptr;
  float vals[kMaxPerThread];
  float sum = 0.0f;
  const bool in_regs = cols <= kThreads * kMaxPerThread;
#pragma unroll
  for (int k = 0; k < kMaxPerThread; ++k) {
    const int c = threadIdx.x + k * kThreads;
    float v = 0.0f;
    if (in_regs && c < cols) {
      v = __half2float(xr[c]);
      if (rr) {
        const half r = __float2half(__half2float(rr[c]) + v);
        rr[c] = r;
        v = __half2float(r);
      }
    }
    vals[k] = v;
    sum += v * v;
  }
  if (!in_regs) {  // very wide rows: a second pass reads the row again
    for (int c = threadIdx.x; c < cols; c += kThreads) {
      float v = __half2float(xr[c]);
      if (rr) {
        const half r = __float2half(__half2float(rr[c]) + v);
        rr[c] = r;
        v = __half2float(r);
      }
      sum += v * v;
    }
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  __shared__ float warp_sums[kThreads / 32];
  __shared__ float inv_rms;
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = sum;
  __syncthreads();
  if (threadIdx.x < 32) {
    float s = threadIdx.x < blockDim.x / 32 ? warp_sums[threadIdx.x] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x == 0) inv_rms = rsqrtf(s / static_cast<float>(cols) + eps);
  }
  __syncthreads();
  half* orow = out + row * cols;
  if (in_regs) {
#pragma unroll
    for (int k = 0; k < kMaxPerThread; ++k) {
      const int c = threadIdx.x + k * kThreads;
      if (c < cols) orow[c] = __float2half(vals[k] * inv_rms * __half2float(w[c]));
    }
  } else {
    const half* src = rr ? rr + 0 : xr;
    for (int c = threadIdx.x; c < cols; c += kThreads)
      orow[c] = __float2half(__half2float(src[c]) * inv_rms * __half2float(w[c]));
  }
}

}  // namespace

void rmsnorm(half* out, half* residual, const half* x, const half* w, int64_t rows, int cols,
             float eps, cudaStream_t s) {
  if (rows <= 0) return;
  rmsnorm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(out, residual, x, w, cols, eps);
  GYRE_CUDA_LAUNCHED();
}

}  // namespace gyre::cuda
