// The one kernel mixed-width weights need beyond qlinear's (qmixed_device.h): gathering a part's
// input columns into a contiguous activation. Memory bound and small next to the GEMVs (it
// reads n * in halves once per part).
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/qmixed_device.h"

namespace gyre::cuda {

namespace {

__global__ void gather_columns_kernel(half* out, const half* x, const int32_t* cols, int64_t n,
                                      int in, int k) {
  const int64_t total = n * k;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / k;
    out[i] = x[t * in + cols[i % k]];
  }
}

}  // namespace

void gather_columns(half* out, const half* x, const int32_t* cols, int64_t n, int in, int k,
                    cudaStream_t s) {
  constexpr int kThreads = 256;
  const int64_t blocks = (n * k + kThreads - 1) / kThreads;
  const int grid = static_cast<int>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
  gather_columns_kernel<<<grid, kThreads, 0, s>>>(out, x, cols, n, in, k);
  GYRE_CUDA_LAUNCHED();
}

}  // namespace gyre::cuda
