// The order keys of FP16 logits, shared by the sampling kernels (sampling.cu) and the fed greedy
// pick (greedy_feed.cu): each logit maps to a 16-bit key whose integer order is the logit order
// (NaN -> 0, excluded; -0 -> +0 so that the two tie as on the host), and (key, lowest id) packs
// into one 64-bit word whose maximum is the host reference's argmax.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace gyre::cuda::sample_keys {

constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ uint32_t key_of_bits(uint32_t b) {
  if ((b & 0x7fffu) > 0x7c00u) return 0;  // NaN
  if (b == 0x8000u) b = 0;
  return (b & 0x8000u) ? (~b & 0xffffu) : (b | 0x8000u);
}

__device__ __forceinline__ uint32_t key_of(half h) {
  return key_of_bits(__half_as_ushort(h));
}

// The largest key and the lowest id holding it, as one 64-bit maximum (0: every logit NaN).
__device__ __forceinline__ unsigned long long best_of(int i, uint32_t k) {
  return (static_cast<unsigned long long>(k) << 32) | (0xffffffffu - static_cast<uint32_t>(i));
}

__device__ __forceinline__ int id_of_best(unsigned long long b) {
  return static_cast<int>(0xffffffffu - static_cast<uint32_t>(b));
}

// The best of row[i] for i = first, first + stride, ... < vocab, reduced over the block (the
// result is valid in thread 0). `warp_best`: blockDim.x / 32 words of shared memory.
__device__ __forceinline__ unsigned long long block_best(const half* __restrict__ row, int vocab,
                                                         int first, int stride,
                                                         unsigned long long* warp_best) {
  unsigned long long b = 0;
  for (int i = first; i < vocab; i += stride) {
    const unsigned long long c = best_of(i, key_of(row[i]));
    b = c > b ? c : b;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long other = __shfl_xor_sync(kFull, b, o);
    b = other > b ? other : b;
  }
  if ((threadIdx.x & 31) == 0) warp_best[threadIdx.x >> 5] = b;
  __syncthreads();
  if (threadIdx.x == 0)
    for (unsigned w = 1; w < blockDim.x / 32; ++w) b = warp_best[w] > b ? warp_best[w] : b;
  return b;
}

}  // namespace gyre::cuda::sample_keys
