// The one kernel mixed-width weights need beyond qlinear's (qmixed_device.h): gathering every
// part's input columns into contiguous activations, all parts in one launch, optionally
// RMS-normalising the row on the way (the norm a fused-norm matmul would apply). Launched with
// PDL (launch.h), so that the parts' GEMVs after it start streaming their weights while it runs.
#include <algorithm>

#include "backend/cuda/launch.h"
#include "backend/cuda/qmixed_device.h"

namespace gyre::cuda {

namespace {

constexpr int kThreads = 256, kPerThread = 4, kChunk = kThreads * kPerThread;

// Block (b, t): gathered entries [b * kChunk, (b + 1) * kChunk) of token t, counted over the
// parts' column lists laid end to end. A row's entries are spread over many blocks: one block per
// row measured 311 tok/s against 367 (Llama-3-8B shape, every weight one padded part, H100), the
// block's dependent index-then-value loads running one after another.
__global__ void __launch_bounds__(kThreads)
    gather_parts_kernel(half* out, const half* x, const int32_t* cols_all, int in, int total,
                        int64_t t0, MixedGather g, const half* norm_w, float eps) {
  pdl_begin();
  const int64_t t = t0 + blockIdx.y;
  const half* xr = x + t * in;
  float inv_rms = 1.0f;
  if (norm_w != nullptr) {  // every block of the row: as rmsnorm.cu, out = x * inv_rms * w
    float sum = 0.0f;
    if (in % 8 == 0) {
      for (int c = threadIdx.x * 8; c < in; c += kThreads * 8) {
        const uint4 u = *reinterpret_cast<const uint4*>(xr + c);
        const half2* h = reinterpret_cast<const half2*>(&u);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float2 f = __half22float2(h[k]);
          sum += f.x * f.x + f.y * f.y;
        }
      }
    } else {
      for (int c = threadIdx.x; c < in; c += kThreads) {
        const float v = __half2float(xr[c]);
        sum += v * v;
      }
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    __shared__ float warp_sums[kThreads / 32];
    __shared__ float inv;
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = sum;
    __syncthreads();
    if (threadIdx.x < 32) {
      float s = threadIdx.x < kThreads / 32 ? warp_sums[threadIdx.x] : 0.0f;
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (threadIdx.x == 0) inv = rsqrtf(s / static_cast<float>(in) + eps);
    }
    __syncthreads();
    inv_rms = inv;
  }
  int32_t cols[kPerThread];
#pragma unroll
  for (int e = 0; e < kPerThread; ++e) {  // every index load in flight before any value load
    const int i = blockIdx.x * kChunk + e * kThreads + threadIdx.x;
    cols[e] = i < total ? cols_all[i] : -1;
  }
#pragma unroll
  for (int e = 0; e < kPerThread; ++e) {
    const int i = blockIdx.x * kChunk + e * kThreads + threadIdx.x;
    if (i >= total) break;
    int p = 0, j = i;
    while (p + 1 < g.parts && j >= g.k[p]) j -= g.k[p++];
    half v = __float2half(0.0f);
    if (cols[e] >= 0) {
      v = xr[cols[e]];
      if (norm_w != nullptr)
        v = __float2half(__half2float(v) * inv_rms * __half2float(norm_w[cols[e]]));
    }
    out[g.offset[p] + t * g.k[p] + j] = v;
  }
}

}  // namespace

void gather_parts(half* out, const half* x, const int32_t* cols_all, int64_t n, int in,
                  const MixedGather& g, cudaStream_t s, const half* norm_w, float eps) {
  int total = 0;
  for (int p = 0; p < g.parts; ++p) total += g.k[p];
  if (n <= 0 || total <= 0) return;
  constexpr int64_t kMaxRows = 65535;  // gridDim.y
  for (int64_t t0 = 0; t0 < n; t0 += kMaxRows) {
    const dim3 grid(static_cast<unsigned>((total + kChunk - 1) / kChunk),
                    static_cast<unsigned>(std::min(n - t0, kMaxRows)));
    launch(gather_parts_kernel, grid, dim3(kThreads), 0, s, out, x, cols_all, in, total, t0, g,
           norm_w, eps);
  }
}

}  // namespace gyre::cuda
