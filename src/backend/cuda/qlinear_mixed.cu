// The one kernel mixed-width weights need beyond qlinear's (qmixed_device.h): gathering every
// part's input columns into contiguous activations, all parts in one launch. Memory bound and
// small next to the GEMVs (it reads n * in halves once).
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/qmixed_device.h"

namespace gyre::cuda {

namespace {

__global__ void gather_parts_kernel(half* out, const half* x, const int32_t* cols_all, int64_t n,
                                    int in, MixedGather g, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    // Element i of the parts' [n, k] blocks laid end to end: find its part.
    int64_t j = i, col0 = 0;
    int p = 0;
    while (p + 1 < g.parts && j >= n * g.k[p]) {
      j -= n * g.k[p];
      col0 += g.k[p];
      ++p;
    }
    const int64_t t = j / g.k[p];
    const int32_t c = cols_all[col0 + j % g.k[p]];
    out[g.offset[p] + j] = c >= 0 ? x[t * in + c] : __float2half(0.0f);
  }
}

}  // namespace

void gather_parts(half* out, const half* x, const int32_t* cols_all, int64_t n, int in,
                  const MixedGather& g, cudaStream_t s) {
  int64_t total = 0;
  for (int p = 0; p < g.parts; ++p) total += n * g.k[p];
  constexpr int kThreads = 256;
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  const int grid = static_cast<int>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
  gather_parts_kernel<<<grid, kThreads, 0, s>>>(out, x, cols_all, n, in, g, total);
  GYRE_CUDA_LAUNCHED();
}

}  // namespace gyre::cuda
