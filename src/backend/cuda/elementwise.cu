// Elementwise kernels: embedding gather, x += y, silu(gate) * up, bias add, dtype conversion
// and the synthetic-weight fill. All are memory bound; each thread handles a few elements with
// a grid-stride loop. Layout: row-major [rows, cols] FP16, f32 arithmetic inside.
// Alternatives tried: none needed; these are a small share of a decode step next to the GEMVs.
#include <cuda_bf16.h>

#include "backend/cuda/launch.h"

namespace gyre::cuda {

namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t count) {
  const int64_t b = (count + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

__global__ void embed_kernel(half* out, const half* table, const int32_t* tokens, int n, int dim) {
  pdl_begin();
  const int64_t total = static_cast<int64_t>(n) * dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / dim, col = i % dim;
    out[i] = table[static_cast<int64_t>(tokens[row]) * dim + col];
  }
}

__global__ void add_kernel(half* x, const half* y, int64_t count) {
  pdl_begin();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = __float2half(__half2float(x[i]) + __half2float(y[i]));
}

__global__ void silu_mul_kernel(half* out, const half* gate, const half* up, int64_t count) {
  pdl_begin();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = __half2float(gate[i]);
    out[i] = __float2half(g / (1.0f + __expf(-g)) * __half2float(up[i]));
  }
}

__global__ void swiglu_interleaved_kernel(half* out, const half* fused, int64_t n, int hidden,
                                          int fused_rows, int block) {
  pdl_begin();
  const int64_t total = n * hidden;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / hidden;
    const int r = static_cast<int>(i % hidden);
    const half* row = fused + t * fused_rows + 2 * block * (r / block) + r % block;
    out[i] = __float2half(silu_times(__half2float(row[0]), __half2float(row[block])));
  }
}

__global__ void split_rows_kernel(OutSplit out, const half* fused, int64_t n, int rows) {
  pdl_begin();
  const int64_t total = n * rows;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    split_store(out, static_cast<int>(i / rows), static_cast<int>(i % rows),
                __half2float(fused[i]));
}

__global__ void add_bias_kernel(half* x, const half* bias, int64_t rows, int64_t cols) {
  pdl_begin();
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = __float2half(__half2float(x[i]) + __half2float(bias[i % cols]));
}

__global__ void half_to_float_kernel(float* dst, const half* src, int64_t count) {
  pdl_begin();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = __half2float(src[i]);
}

__global__ void convert_kernel(half* dst, const void* src, bool is_bf16, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float f = is_bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(src)[i])
                            : static_cast<const float*>(src)[i];
    dst[i] = __float2half(f);
  }
}

__device__ uint64_t mix64(uint64_t z) {  // splitmix64 finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_random_kernel(half* dst, int64_t count, uint64_t seed, float scale,
                                   float offset) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i));
    const float u = static_cast<float>(h >> 40) * (2.0f / 16777216.0f) - 1.0f;
    dst[i] = __float2half(offset + scale * u);
  }
}

}  // namespace

bool pdl_supported() {
  static const bool supported = [] {
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
      return false;
    return major >= 9;
  }();
  return supported;
}

void embed(half* out, const half* table, const int32_t* tokens, int n, int dim, cudaStream_t s) {
  launch(embed_kernel, blocks_for(static_cast<int64_t>(n) * dim), kThreads, 0, s, out, table,
         tokens, n, dim);
  GYRE_CUDA_LAUNCHED();
}

void add(half* x, const half* y, int64_t count, cudaStream_t s) {
  launch(add_kernel, blocks_for(count), kThreads, 0, s, x, y, count);
  GYRE_CUDA_LAUNCHED();
}

void silu_mul(half* out, const half* gate, const half* up, int64_t count, cudaStream_t s) {
  launch(silu_mul_kernel, blocks_for(count), kThreads, 0, s, out, gate, up, count);
  GYRE_CUDA_LAUNCHED();
}

void swiglu_interleaved(half* out, const half* fused, int64_t n, int hidden, int fused_rows,
                        int block, cudaStream_t s) {
  launch(swiglu_interleaved_kernel, blocks_for(n * hidden), kThreads, 0, s, out, fused, n, hidden,
         fused_rows, block);
  GYRE_CUDA_LAUNCHED();
}

void split_rows(const OutSplit& out, const half* fused, int64_t n, int rows, cudaStream_t s) {
  launch(split_rows_kernel, blocks_for(n * rows), kThreads, 0, s, out, fused, n, rows);
  GYRE_CUDA_LAUNCHED();
}

void add_bias(half* x, const half* bias, int64_t rows, int64_t cols, cudaStream_t s) {
  launch(add_bias_kernel, blocks_for(rows * cols), kThreads, 0, s, x, bias, rows, cols);
  GYRE_CUDA_LAUNCHED();
}

void half_to_float(float* dst, const half* src, int64_t count, cudaStream_t s) {
  launch(half_to_float_kernel, blocks_for(count), kThreads, 0, s, dst, src, count);
  GYRE_CUDA_LAUNCHED();
}

void convert_to_half(half* dst, const void* src, bool is_bf16, int64_t count, cudaStream_t s) {
  convert_kernel<<<blocks_for(count), kThreads, 0, s>>>(dst, src, is_bf16, count);
  GYRE_CUDA_LAUNCHED();
}

void fill_random(half* dst, int64_t count, uint64_t seed, float scale, float offset,
                 cudaStream_t s) {
  fill_random_kernel<<<blocks_for(count), kThreads, 0, s>>>(dst, count, seed, scale, offset);
  GYRE_CUDA_LAUNCHED();
}

}  // namespace gyre::cuda
