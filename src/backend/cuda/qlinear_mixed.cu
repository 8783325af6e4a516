// The one kernel mixed-width weights need beyond qlinear's (qmixed_device.h): gathering every
// part's input columns into contiguous activations, all parts in one launch, optionally
// RMS-normalising the row on the way (the norm a fused-norm matmul would apply). One block per
// token row; launched with PDL (launch.h) so that the parts' GEMVs after it start streaming their
// weights while it runs (a plain launch measured ~2.4 us per mixed matmul more in the decode
// chain, bench/NOTES.md session 18).
#include "backend/cuda/launch.h"
#include "backend/cuda/qmixed_device.h"

namespace gyre::cuda {

namespace {

constexpr int kThreads = 512;

__global__ void __launch_bounds__(kThreads)
    gather_parts_kernel(half* out, const half* x, const int32_t* cols_all, int in, MixedGather g,
                        const half* norm_w, float eps) {
  pdl_begin();
  const int64_t t = blockIdx.x;
  const half* xr = x + t * in;
  float inv_rms = 1.0f;
  if (norm_w != nullptr) {  // as rmsnorm.cu: f32 sum of squares, out = x * inv_rms * w
    float sum = 0.0f;
    for (int c = threadIdx.x; c < in; c += kThreads) {
      const float v = __half2float(xr[c]);
      sum += v * v;
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
  int64_t col0 = 0;
  for (int p = 0; p < g.parts; ++p) {
    half* o = out + g.offset[p] + t * g.k[p];
    for (int j = threadIdx.x; j < g.k[p]; j += kThreads) {
      const int32_t c = cols_all[col0 + j];
      half v = __float2half(0.0f);
      if (c >= 0) {
        v = xr[c];
        if (norm_w != nullptr)
          v = __float2half(__half2float(v) * inv_rms * __half2float(norm_w[c]));
      }
      o[j] = v;
    }
    col0 += g.k[p];
  }
}

}  // namespace

void gather_parts(half* out, const half* x, const int32_t* cols_all, int64_t n, int in,
                  const MixedGather& g, cudaStream_t s, const half* norm_w, float eps) {
  if (n <= 0) return;
  launch(gather_parts_kernel, dim3(static_cast<unsigned>(n)), dim3(kThreads), 0, s, out, x,
         cols_all, in, g, norm_w, eps);
}

}  // namespace gyre::cuda
