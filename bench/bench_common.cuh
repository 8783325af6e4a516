// Helpers shared by the standalone kernel benches (qlinear_bench, gemv4_bench,
// qlinear_bits_bench): error check, deterministic device fills, CUDA-event timing, and a random
// quantized weight in the device layout (speed only: correctness is in the tests).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/cuda/qlinear.h"

#define CK(call)                                                                           \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

__global__ void fill_bytes(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = uint8_t(h);
  }
}
__global__ void fill_halves(__half* p, size_t n, float lo, float span, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 2246822519u;
    p[i] = __float2half(lo + span * float(h & 0xffff) / 65536.0f);
  }
}

// Median over `reps` runs of the mean time of `iters` calls f(i), after 3 warm-up calls.
template <typename F>
float time_ms(F&& f, int iters, int reps = 5) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f(i);
  CK(cudaDeviceSynchronize());
  std::vector<float> runs;
  for (int rep = 0; rep < reps; ++rep) {
    CK(cudaEventRecord(a));
    for (int i = 0; i < iters; ++i) f(i);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    runs.push_back(ms / iters);
  }
  CK(cudaGetLastError());
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

struct Weight {
  gyre::QWeightDevice w;
  void* mem;
};

// Random codes and small positive scales (and mins) in the device layout of d.
inline Weight make_weight(const gyre::QWeightDesc& d, uint32_t seed) {
  Weight out{};
  const size_t total = gyre::qweight_device_bytes(d);
  CK(cudaMalloc(&out.mem, total));
  out.w = gyre::qweight_device_view(d, out.mem);
  auto* p = static_cast<uint8_t*>(out.mem);
  const size_t qb = static_cast<const uint8_t*>(out.w.scales) - p;  // incl. alignment padding
  fill_bytes<<<1024, 256>>>(p, qb, seed);
  fill_halves<<<1024, 256>>>(reinterpret_cast<__half*>(p + qb), (total - qb) / 2, 0.001f, 0.01f,
                             seed);
  CK(cudaGetLastError());
  return out;
}

// Prints the device and measures its copy bandwidth (1 GiB device to device, bytes read +
// written over time): the denominator of every bench's "% of copy".
inline double print_device_and_copy_gbs() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  const size_t big = size_t(1) << 30;
  void *s, *t;
  CK(cudaMalloc(&s, big));
  CK(cudaMalloc(&t, big));
  CK(cudaMemset(s, 1, big));
  const float copy_ms =
      time_ms([&](int) { CK(cudaMemcpyAsync(t, s, big, cudaMemcpyDeviceToDevice)); }, 10);
  const double copy_gbs = 2.0 * big / copy_ms / 1e6;
  std::printf("copy bandwidth: %.0f GB/s\n", copy_gbs);
  CK(cudaFree(s));
  CK(cudaFree(t));
  return copy_gbs;
}
