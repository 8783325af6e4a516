// The device decode of the in-place word arrangement of 2/3/5/6-bit weights (qlinear_inplace.h says
// why and where the bits are) into m16n8k16 A fragments.
#pragma once
#include <cstdint>

#include "backend/cuda/qlinear_inplace.h"
#include "backend/cuda/qlinear_kernels.cuh"

namespace gyre::qlinear_detail {

// s.v = the half pair 1024 + q 2^p -> q - OFFSET: (1024 + q 2^p) 2^-p - (1024 2^-p + OFFSET) in
// one HFMA2, exact (the product is exact, the result a small integer).
template <uint32_t OFFSET>
__device__ __forceinline__ uint32_t inplace_unscale(InplaceSlot s) {
  const __half2 h = __hfma2(as_half2(s.v), as_half2(half2_pow2_neg_bits(s.p)),
                            as_half2(half2_int_bits(-((1024 >> s.p) + static_cast<int>(OFFSET)))));
  uint32_t out;
  memcpy(&out, &h, 4);
  return out;
}

// Step j of a block in the in-place arrangement (lo: its low-plane words, hi: its high-plane
// word) -> the 4 f16x2 registers of its A fragment, each q - OFFSET exactly: the values
// narrow_to_fragment gives on the split planes' arrangement.
template <int BITS, uint32_t OFFSET>
__device__ __forceinline__ void inplace_to_fragment(const uint32_t* lo, const uint32_t* hi, int j,
                                                    uint32_t a[4]) {
#pragma unroll
  for (int r = 0; r < 4; ++r) a[r] = inplace_unscale<OFFSET>(inplace_slot<BITS>(lo, hi, 4 * j + r));
}

// int4_word_to_fragment (qlinear_kernels.cuh) with each (w & mask) | 0x6400 as one LOP3 (and_or:
// the exponent in a register) where the C expression compiles to two; the same bits, so the
// same results. The 4-bit stream GEMV takes it by default (GYRE_CUDA_INT4_LOP3=0: the old one,
// qlinear_gemv_stream.cu).
__device__ __forceinline__ void int4_word_to_fragment_lop3(uint32_t w, __half2 lo_base,
                                                           __half2 hi_base, uint32_t a[4]) {
  const __half2 sixteenth = __float2half2_rn(0.0625f);
  const uint32_t w8 = w >> 8;
  const __half2 r0 = __hsub2(as_half2(and_or(w, 0x000F000Fu, 0x64006400u)), lo_base);
  const __half2 r1 = __hfma2(as_half2(and_or(w, 0x00F000F0u, 0x64006400u)), sixteenth, hi_base);
  const __half2 r2 = __hsub2(as_half2(and_or(w8, 0x000F000Fu, 0x64006400u)), lo_base);
  const __half2 r3 = __hfma2(as_half2(and_or(w8, 0x00F000F0u, 0x64006400u)), sixteenth, hi_base);
  memcpy(&a[0], &r0, 4);
  memcpy(&a[1], &r1, 4);
  memcpy(&a[2], &r2, 4);
  memcpy(&a[3], &r3, 4);
}

}  // namespace gyre::qlinear_detail
