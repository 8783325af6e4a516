// Device helpers shared by the quantized GEMV, GEMM and dequantization kernels: streaming
// loads, per-group scales, and the int4/int8 -> half conversion of one 16-byte chunk.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace gyre::qlinear_detail {

struct Params {
  const uint8_t* qweight;
  const void* scales;
  const void* mins;
  const int32_t* perm;
  const __half* x;
  __half* y;
  const __half* bias;
  int rows, cols, n, group, bits;
  int ksplit;  // GEMV: warps sharing one row group (1, 2 or 4)
  bool scale_f32, asym;
};

// Weights are read once: keep them out of L1 so x stays there.
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ __forceinline__ __half2 as_half2(uint32_t v) {
  __half2 h;
  memcpy(&h, &v, 4);
  return h;
}

// Scale and min (zero when symmetric) of scale entry idx, broadcast to both halves.
__device__ __forceinline__ void load_scale(const Params& p, int64_t idx, __half2& s, __half2& m) {
  if (p.scale_f32) {
    s = __float2half2_rn(static_cast<const float*>(p.scales)[idx]);
    m = p.asym ? __float2half2_rn(static_cast<const float*>(p.mins)[idx]) : __float2half2_rn(0.f);
  } else {
    s = __half2half2(static_cast<const __half*>(p.scales)[idx]);
    m = p.asym ? __half2half2(static_cast<const __half*>(p.mins)[idx]) : __float2half2_rn(0.f);
  }
}

// One 16-byte chunk -> BITS == 4: 16 half2 (32 columns), BITS == 8: 8 half2 (16 columns), in
// column order. 0x6400 | q is the half 1024 + q (the unit in the last place of 1024 is 1), so
// subtracting 1024 (+ the symmetric offset) recovers q - offset exactly; one multiply (or FMA
// with the min) applies the group's scale.
template <int BITS>
__device__ __forceinline__ void dequant_chunk(uint4 q, __half2 s, __half2 m, bool asym,
                                              __half2* w) {
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
  if constexpr (BITS == 4) {
    const __half2 base = as_half2(asym ? 0x64006400u : 0x64086408u);  // 1024 or 1032
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t v = ((words[i] >> (4 * k)) & 0x000F000Fu) | 0x64006400u;
        const __half2 qi = __hsub2(as_half2(v), base);
        w[4 * i + k] = __hfma2(qi, s, m);  // m is zero when symmetric: no select
      }
    }
  } else {
    const __half2 base = as_half2(asym ? 0x64006400u : 0x64806480u);  // 1024 or 1152
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        // Bytes (2k, 2k+1) of the word under 0x64 exponent bytes.
        const uint32_t v = __byte_perm(words[i], 0x64646464u, k ? 0x5342u : 0x5140u);
        const __half2 qi = __hsub2(as_half2(v), base);
        w[2 * i + k] = __hfma2(qi, s, m);
      }
    }
  }
}

// COLS activations of token t starting at packed column c0, as half2 pairs (gathered through
// perm for act-order weights).
template <int COLS>
__device__ __forceinline__ void load_x(const Params& p, int t, int c0, __half2* xv) {
  const __half* row = p.x + static_cast<int64_t>(t) * p.cols;
  if (p.perm == nullptr) {
    const uint4* src = reinterpret_cast<const uint4*>(row + c0);
#pragma unroll
    for (int i = 0; i < COLS / 8; ++i) {
      const uint4 v = __ldg(src + i);
      xv[4 * i + 0] = as_half2(v.x);
      xv[4 * i + 1] = as_half2(v.y);
      xv[4 * i + 2] = as_half2(v.z);
      xv[4 * i + 3] = as_half2(v.w);
    }
  } else {
#pragma unroll
    for (int j = 0; j < COLS / 2; ++j) {
      xv[j] = __halves2half2(row[__ldg(p.perm + c0 + 2 * j)], row[__ldg(p.perm + c0 + 2 * j + 1)]);
    }
  }
}

}  // namespace gyre::qlinear_detail
