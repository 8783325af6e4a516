// One warp transforms one B-block (B = 32 E, E = 1, 2, 4 or 8) of a rotated layer's input
// (backend/cpu/hadamard.h): lane l holds elements [l E, (l + 1) E) of the block in registers, the
// butterfly stages below E run inside the lane and the others through shuffles, so no shared
// memory round trip or block-wide barrier sits between stages. Shared by the stand-alone
// rotation kernel (hadamard.cu) and the stream GEMV's staging of x (qlinear_stream.cuh).
//
// Stage h pairs element i (bit h clear) with i + h: the low one becomes a + b, the high one
// a - b, in the order h = 1, 2, 4, ..., the float operations of hadamard.cu's shared-memory
// kernel, so every CUDA path rounds a rotation identically.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace gyre::cuda {

// Largest block the warp transform handles (8 values per lane).
constexpr int kHadamardWarpMaxBlock = 256;

// v[i]: this lane's E values of block i of M (signs already applied); unscaled H_B v[i] on
// return. The M blocks go stage by stage together, so their shuffle chains overlap.
template <int E, int M = 1>
__device__ __forceinline__ void warp_fwht(float (&v)[M][E]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int h = 1; h < E; h *= 2) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
#pragma unroll
      for (int k = 0; k < E; ++k) {
        if (k & h) continue;
        const float a = v[i][k], b = v[i][k | h];
        v[i][k] = a + b;
        v[i][k | h] = a - b;
      }
    }
  }
#pragma unroll
  for (int m = 1; m < 32; m *= 2) {
    const bool high = lane & m;
#pragma unroll
    for (int i = 0; i < M; ++i) {
#pragma unroll
      for (int k = 0; k < E; ++k) {
        const float other = __shfl_xor_sync(0xffffffffu, v[i][k], m);
        v[i][k] = high ? other - v[i][k] : v[i][k] + other;
      }
    }
  }
}

// E consecutive halves as one access (E = 1, 2, 4, 8: 2, 4, 8 or 16 bytes); p is 2E-byte aligned.
template <int E>
struct HalfVec;
template <>
struct HalfVec<1> {
  using T = unsigned short;
};
template <>
struct HalfVec<2> {
  using T = unsigned int;
};
template <>
struct HalfVec<4> {
  using T = uint2;
};
template <>
struct HalfVec<8> {
  using T = uint4;
};

// E halves at src (2E-byte aligned) -> floats times E signs (+-1 bytes, E-byte aligned).
template <int E>
__device__ __forceinline__ void load_signed(const __half* src, const int8_t* signs, float (&v)[E]) {
  using T = typename HalfVec<E>::T;
  const T raw = *reinterpret_cast<const T*>(src);
  __half h[E];
  memcpy(h, &raw, sizeof(h));
  int8_t s[E];
#pragma unroll
  for (int k = 0; k < E; ++k) s[k] = signs[k];
#pragma unroll
  for (int k = 0; k < E; ++k) v[k] = __half2float(h[k]) * static_cast<float>(s[k]);
}

// E floats times scale, rounded to FP16, into dst (2E-byte aligned).
template <int E>
__device__ __forceinline__ void store_scaled(__half* dst, const float (&v)[E], float scale) {
  using T = typename HalfVec<E>::T;
  __half h[E];
#pragma unroll
  for (int k = 0; k < E; ++k) h[k] = __float2half(v[k] * scale);
  T raw;
  memcpy(&raw, h, sizeof(h));
  *reinterpret_cast<T*>(dst) = raw;
}

}  // namespace gyre::cuda
