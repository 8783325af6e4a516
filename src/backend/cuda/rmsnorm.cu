// RMSNorm, optionally fused with the residual add before it:
//   residual += x (rounded to FP16, as the residual stream is stored); out = r / rms(r) * w.
// One block per row; the sum of squares is accumulated in f32 and reduced with warp shuffles.
// Layout: row-major [rows, cols] FP16. Two kernels: a 16-byte-access one for rows of a multiple of
// 8 (up to 16384), the row kept in registers; a scalar one with 1024 threads for any width.
// Measured (ncu, H100): the scalar kernel took ~7.4 us per launch on 4096-wide rows, a large
// share of a decode step's small-kernel time, which is why the vector kernel exists. The vector
// kernel reads its weight before the PDL wait and issues all of a row's loads before any store:
// H100, Llama-3-8B 4-bit, forward of a 32-row step 4.85 -> 4.80 ms, of a 1-row step 2.82 -> 2.74
// with the fused rope/store (bench/NOTES.md).
#include "backend/cuda/launch.h"

namespace gyre::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kMaxPerThread = 16;  // cols up to 16384 keep the row in registers

__global__ void __launch_bounds__(kThreads)
    rmsnorm_kernel(half* out, half* residual, const half* x, const half* w, int cols, float eps) {
  pdl_begin();
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

// Rows of a multiple of 8 elements up to 8 * 256 * kMaxVec: 16-byte loads, the row in registers,
// 256 threads (a decode row is a single block, so fewer, wider accesses finish sooner).
constexpr int kVecThreads = 256, kMaxVec = 8;

__global__ void __launch_bounds__(kVecThreads)
    rmsnorm_vec_kernel(half* out, half* residual, const half* x, const half* w, int cols,
                       float eps) {
  // The weight is never written by a kernel, so it is read before the wait on the previous
  // kernel (pdl_begin): its load overlaps that kernel's tail instead of following the reduction.
  const int nvec = cols / 8;
  const uint4* wv = reinterpret_cast<const uint4*>(w);
  uint4 wvals[kMaxVec];
#pragma unroll
  for (int k = 0; k < kMaxVec; ++k) {
    const int i = threadIdx.x + k * kVecThreads;
    if (i >= nvec) break;
    wvals[k] = wv[i];
  }
  pdl_begin();
  const int64_t row = blockIdx.x;
  const uint4* xr = reinterpret_cast<const uint4*>(x + row * cols);
  uint4* rr = residual ? reinterpret_cast<uint4*>(residual + row * cols) : nullptr;
  // Every load of the row is issued before the first residual store: a store may alias a later
  // load as far as the compiler knows, so an interleaved loop would pay one memory round trip
  // per chunk instead of one for the row.
  uint4 vals[kMaxVec], res[kMaxVec];
#pragma unroll
  for (int k = 0; k < kMaxVec; ++k) {
    const int i = threadIdx.x + k * kVecThreads;
    if (i < nvec) {
      vals[k] = xr[i];
      if (rr) res[k] = rr[i];
    }
  }
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kMaxVec; ++k) {
    const int i = threadIdx.x + k * kVecThreads;
    if (i >= nvec) break;
    uint4 v = vals[k];
    if (rr) {
      half2* vh = reinterpret_cast<half2*>(&v);
      const half2* rh = reinterpret_cast<const half2*>(&res[k]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 a = __half22float2(vh[e]), b = __half22float2(rh[e]);
        vh[e] = __floats2half2_rn(a.x + b.x, a.y + b.y);
      }
      rr[i] = v;
    }
    const half2* vh = reinterpret_cast<const half2*>(&v);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __half22float2(vh[e]);
      sum += f.x * f.x + f.y * f.y;
    }
    vals[k] = v;
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  __shared__ float warp_sums[kVecThreads / 32];
  __shared__ float inv_rms;
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = sum;
  __syncthreads();
  if (threadIdx.x < 32) {
    float s = threadIdx.x < kVecThreads / 32 ? warp_sums[threadIdx.x] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x == 0) inv_rms = rsqrtf(s / static_cast<float>(cols) + eps);
  }
  __syncthreads();
  uint4* orow = reinterpret_cast<uint4*>(out + row * cols);
#pragma unroll
  for (int k = 0; k < kMaxVec; ++k) {
    const int i = threadIdx.x + k * kVecThreads;
    if (i >= nvec) break;
    const uint4 wi = wvals[k];
    uint4 o;
    const half2* vh = reinterpret_cast<const half2*>(&vals[k]);
    const half2* wh = reinterpret_cast<const half2*>(&wi);
    half2* oh = reinterpret_cast<half2*>(&o);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 a = __half22float2(vh[e]), b = __half22float2(wh[e]);
      oh[e] = __floats2half2_rn(a.x * inv_rms * b.x, a.y * inv_rms * b.y);
    }
    orow[i] = o;
  }
}

}  // namespace

void rmsnorm(half* out, half* residual, const half* x, const half* w, int64_t rows, int cols,
             float eps, cudaStream_t s) {
  if (rows <= 0) return;
  const bool aligned = reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
                       (residual == nullptr || reinterpret_cast<uintptr_t>(residual) % 16 == 0);
  if (aligned && cols % 8 == 0 && cols <= 8 * kVecThreads * kMaxVec) {
    launch(rmsnorm_vec_kernel, static_cast<unsigned>(rows), kVecThreads, 0, s, out, residual, x, w,
           cols, eps);
    return;
  }
  launch(rmsnorm_kernel, static_cast<unsigned>(rows), kThreads, 0, s, out, residual, x, w, cols,
         eps);
  GYRE_CUDA_LAUNCHED();
}

}  // namespace gyre::cuda
