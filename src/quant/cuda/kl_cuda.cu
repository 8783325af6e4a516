#include <cuda_fp16.h>

#include <vector>

#include "quant/cuda/gptq_cuda_common.h"
#include "quant/cuda/kl_cuda.h"

namespace gyre::quant::cuda {

namespace {

constexpr int kThreads = 256;

// Sum of v over the block (every thread gets it); `scratch` holds kThreads / 32 doubles.
__device__ double block_sum(double v, double* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // scratch may still be read from the previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  double s = 0;
  for (int w = 0; w < kThreads / 32; ++w) s += scratch[w];
  return s;
}

__device__ double block_max(double v, double* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_down_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  double m = scratch[0];
  for (int w = 1; w < kThreads / 32; ++w) m = fmax(m, scratch[w]);
  return m;
}

// One block per row: the two log-sum-exps, then sum p (lp - lq), all in float64.
__global__ void row_kl(const __half* ref, const __half* logits, int64_t vocab, double* out) {
  __shared__ double scratch[kThreads / 32];
  const __half* a = ref + blockIdx.x * vocab;
  const __half* b = logits + blockIdx.x * vocab;
  double ma = -INFINITY, mb = -INFINITY;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    ma = fmax(ma, static_cast<double>(__half2float(a[i])));
    mb = fmax(mb, static_cast<double>(__half2float(b[i])));
  }
  ma = block_max(ma, scratch);
  mb = block_max(mb, scratch);
  double sa = 0, sb = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    sa += exp(static_cast<double>(__half2float(a[i])) - ma);
    sb += exp(static_cast<double>(__half2float(b[i])) - mb);
  }
  const double la0 = ma + log(block_sum(sa, scratch)), lb0 = mb + log(block_sum(sb, scratch));
  double kl = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const double la = static_cast<double>(__half2float(a[i])) - la0;
    const double lb = static_cast<double>(__half2float(b[i])) - lb0;
    kl += exp(la) * (la - lb);
  }
  kl = block_sum(kl, scratch);
  if (threadIdx.x == 0) out[blockIdx.x] = kl;
}

}  // namespace

double mean_kl_f16(const void* ref, const void* logits, int64_t rows, int64_t vocab) {
  if (rows <= 0) return 0.0;
  cudaPointerAttributes attr{};
  GYRE_CUDA_CHECK(cudaPointerGetAttributes(&attr, ref));
  GYRE_CHECK(attr.type == cudaMemoryTypeDevice, "internal: KL logits are not on a GPU");
  GYRE_CUDA_CHECK(cudaSetDevice(attr.device));
  double* per_row = nullptr;
  GYRE_CUDA_CHECK(cudaMalloc(&per_row, static_cast<size_t>(rows) * sizeof(double)));
  row_kl<<<static_cast<unsigned>(rows), kThreads>>>(
      static_cast<const __half*>(ref), static_cast<const __half*>(logits), vocab, per_row);
  const cudaError_t launched = cudaGetLastError();
  std::vector<double> host(static_cast<size_t>(rows));
  const cudaError_t copied =
      cudaMemcpy(host.data(), per_row, host.size() * sizeof(double), cudaMemcpyDeviceToHost);
  cudaFree(per_row);
  GYRE_CUDA_CHECK(launched);
  GYRE_CUDA_CHECK(copied);
  double sum = 0;
  for (double v : host) sum += v;
  return sum / static_cast<double>(rows);
}

size_t device_memory_used() {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return total_b - free_b;
}

}  // namespace gyre::quant::cuda
