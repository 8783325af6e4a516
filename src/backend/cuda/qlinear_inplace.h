// The in-place word arrangement of 2/3/5/6/8-bit weights in the tiled layout (qlinear_stream.cuh):
// which bits of a lane's words hold which value, on the host and the device (the repack writes
// it, the decode in qlinear_inplace.cuh reads it, host tests check the two against each other).
// GYRE_CUDA_BITS_DECODE=new (the default); "old" keeps the split planes' arrangement and
// narrow_to_fragment, for an A/B in one binary.
//
// Why: at 2/3 bits the stream GEMV is bound by instructions per warp, not bytes (round 7,
// bench/qlinear_notes.md). The split planes cost every A register a shift and a mask per plane,
// an OR of the planes and the subtraction (3-bit: 95 decode instructions per 64-column block in
// the SASS against 4-bit's 56). Here a value's bits sit together at a position p <= 10 - BITS of
// a 16-bit half, so one LOP3 ((w & mask) | 0x6400) gives the half 1024 + q 2^p, and one HFMA2
// with 2^-p and -(1024 2^-p + offset) gives q - offset exactly (the product is exact, the result
// a small integer): 2 instructions per register, plus one shift per word for the values above
// bit 9 (3-bit: 43 per block). 5 and 6 bits (session 11, nb56) take the same scheme.
//
// A lane's BITS words of a block (words 0..L-1: its low-plane slots, L = 2 at 2/3 bits, 4 at 5/6;
// words L..BITS-1: its high-plane slots, so that loads and ring stay the old ones) hold the 16
// pairs k = 4j + r of its A fragments (step j, register r: pair_position), the first column's
// value in the low half and the second's at the same bits of the high half:
//   2 bits: pair k = 8w + s of word w at bits 2s (the old arrangement: the layout is unchanged,
//           only the decode differs); s < 5 in place, s >= 5 from w >> 10 at 2 (s - 5).
//   3 bits: pair k = 5w + s (s < 5) of word w at bits 3s; s < 3 in place, s = 3, 4 from
//           w >> (9 - w) at 3s - 9 + w. Pair 15: bit w of its values at bit 15 of word w, i.e.
//           at bit 6 + w of w >> (9 - w): three LOP3s put the value at bits 6-8.
//   5 bits: pair k = 3w + s (s < 3) of word w (0..4) at bits 5s; s = 0, 1 in place (p = 0, 5),
//           s = 2 from w >> (10 - w) at p = w. Pair 15: bit w at bit 15 of word w, i.e. at bit
//           5 + w of w >> (10 - w): five LOP3s put it at bits 5-9 (p = 5). 5 shifts per block.
//   6 bits: pair 2w of word w (0..5) at bits 0-5 (in place, p = 0), pair 2w + 1 at bits 10-15
//           (from w >> 6 at p = 4). Bits 6-9 hold pairs 12-15 at p = 4: word i < 4 their value
//           bits 2-5 of pair 12 + i (in place at 6-9), words 4 and 5 the value bits 0-1 of pairs
//           12, 13 (word 4) and 14, 15 (word 5) at bits 6-7 and 8-9, brought to 4-5 by a shift
//           of 2 or 4: two LOP3s per pair. A value at any p <= 4 covers bits 4-5, so each of the
//           four pieces needs a view of its own (10 shifts per block).
//   8 bits: pair 2w + s of word w (0..7) at bits 8s (first column) and 16 + 8s (second): the
//           split planes' arrangement of one 8-bit plane. One PRMT puts both bytes of a pair
//           under the exponent bytes (p = 0): 1 instruction per register, plus the HFMA2.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace gyre::qlinear_detail {

// FP16 bits of the integer v (|v| < 2048: exact), both halves.
__host__ __device__ constexpr uint32_t half2_int_bits(int v) {
  const uint32_t sign = v < 0 ? 0x8000u : 0u;
  const uint32_t m = static_cast<uint32_t>(v < 0 ? -v : v);
  if (m == 0) return sign * 0x00010001u;
  int e = 0;
  while ((m >> (e + 1)) != 0) ++e;  // m in [2^e, 2^(e+1))
  const uint32_t h = sign | static_cast<uint32_t>(15 + e) << 10 | ((m - (1u << e)) << (10 - e));
  return h * 0x00010001u;
}

// FP16 bits of 2^-e (0 <= e <= 14), both halves.
__host__ __device__ constexpr uint32_t half2_pow2_neg_bits(int e) {
  return (static_cast<uint32_t>(15 - e) << 10) * 0x00010001u;
}

static_assert(half2_int_bits(-1028) == 0xE404E404u && half2_int_bits(-4) == 0xC400C400u);
static_assert(half2_int_bits(-18) == 0xCC80CC80u && half2_int_bits(1) == 0x3C003C00u);
static_assert(half2_pow2_neg_bits(0) == 0x3C003C00u && half2_pow2_neg_bits(4) == 0x2C002C00u);

// Row and first column of pair k (0..15) of lane (g, t) in tile T, block b.
__host__ __device__ inline void pair_position(int tile, int b, int lane, int k, int& row,
                                              int& col) {
  const int g = lane / 4, t = lane % 4, j = k / 4, r = k % 4;
  row = 16 * tile + g + 8 * (r % 2);
  col = 64 * b + 32 * (j / 2) + 8 * t + 4 * (j % 2) + 2 * (r / 2);
}

// (a & b) | c in one LOP3: written in C, ptxas emits an AND and an OR (SASS LOP3 takes one
// immediate, and it does not keep the other constant in a register for the fusion).
__host__ __device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t b, uint32_t c) {
#ifdef __CUDA_ARCH__
  uint32_t out;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(out) : "r"(a), "r"(b), "r"(c));
  return out;
#else
  return (a & b) | c;
#endif
}

// The 8-bit decode's PRMT selectors of pair k % 2: bytes k % 2 and 2 + k % 2 of the word, each
// under byte 0 of the second operand (0x64). The host's tests check them through byte_perm_ref.
__host__ __device__ constexpr uint32_t prmt_pair8(int k) {
  return k % 2 == 0 ? 0x4240u : 0x4341u;
}

// PTX prmt (__byte_perm) in its default mode, for the host: byte i of the result is byte
// (s >> 4 i) & 7 of the eight bytes {x, y} (x's bytes 0-3, then y's), that byte's sign replicated
// where bit 3 of the nibble is set.
__host__ __device__ constexpr uint32_t byte_perm_ref(uint32_t x, uint32_t y, uint32_t s) {
  const uint64_t bytes = uint64_t{y} << 32 | x;
  uint32_t out = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t c = (s >> (4 * i)) & 0xFu;
    uint32_t b = static_cast<uint32_t>(bytes >> (8 * (c & 7u))) & 0xFFu;
    if ((c & 8u) != 0) b = (b & 0x80u) != 0 ? 0xFFu : 0u;
    out |= b << (8 * i);
  }
  return out;
}

// A register before its HFMA2: v = the half pair 1024 + q 2^p (exponent bits 0x6400, the value
// at bits p.., nothing else).
struct InplaceSlot {
  uint32_t v;
  int p;
};

// The BITS-bit values at bits p.. of both halves of w under the exponent.
template <int BITS>
__host__ __device__ __forceinline__ InplaceSlot inplace_slot_at(uint32_t w, int p) {
  return {and_or(w, (((1u << BITS) - 1) * 0x00010001u) << p, 0x64006400u), p};
}

// Pair k (0..15) of a block: lo = its low-plane words (2), hi = its high-plane word (3 bits).
template <int BITS>
__host__ __device__ __forceinline__ InplaceSlot inplace_slot(const uint32_t* lo, const uint32_t* hi,
                                                             int k) {
  static_assert(BITS == 2 || BITS == 3 || BITS == 5 || BITS == 6 || BITS == 8,
                "in-place: 2, 3, 5, 6 or 8 bits");
  if constexpr (BITS == 8) {
    (void)hi;
    const uint32_t w = lo[k / 2];
#ifdef __CUDA_ARCH__
    return {__byte_perm(w, 0x64u, prmt_pair8(k)), 0};
#else
    return {((w >> (8 * (k % 2))) & 0x00FF00FFu) | 0x64006400u, 0};
#endif
  } else if constexpr (BITS == 2) {
    (void)hi;
    const int w = k / 8, s = k % 8;
    return s < 5 ? inplace_slot_at<2>(lo[w], 2 * s) : inplace_slot_at<2>(lo[w] >> 10, 2 * (s - 5));
  } else if constexpr (BITS == 3) {
    const uint32_t words[3] = {lo[0], lo[1], hi[0]};
    if (k == 15) {  // bit w of the value: bit 15 of word w, at 6 + w after the shift by 9 - w
      const uint32_t v = and_or(words[0] >> 9, 0x00400040u, 0x64006400u);
      return {and_or(words[2] >> 7, 0x01000100u, and_or(words[1] >> 8, 0x00800080u, v)), 6};
    }
    const int w = k / 5, s = k % 5;
    return s < 3 ? inplace_slot_at<3>(words[w], 3 * s)
                 : inplace_slot_at<3>(words[w] >> (9 - w), 3 * s - 9 + w);
  } else if constexpr (BITS == 5) {
    const uint32_t words[5] = {lo[0], lo[1], lo[2], lo[3], hi[0]};
    if (k == 15) {  // bit w of the value: bit 15 of word w, at 5 + w after the shift by 10 - w
      uint32_t v = 0x64006400u;
      for (int w = 0; w < 5; ++w) v = and_or(words[w] >> (10 - w), 0x00200020u << w, v);
      return {v, 5};
    }
    const int w = k / 3, s = k % 3;
    return s < 2 ? inplace_slot_at<5>(words[w], 5 * s)
                 : inplace_slot_at<5>(words[w] >> (10 - w), w);
  } else {
    const uint32_t words[6] = {lo[0], lo[1], lo[2], lo[3], hi[0], hi[1]};
    if (k >= 12) {  // bits 2-5 at 6-9 of word i, bits 0-1 at 6 + 2 (i % 2) of word 4 + i / 2
      const int i = k - 12;
      const uint32_t v = and_or(words[i], 0x03C003C0u, 0x64006400u);
      return {and_or(words[4 + i / 2] >> (2 + 2 * (i % 2)), 0x00300030u, v), 4};
    }
    return k % 2 == 0 ? inplace_slot_at<6>(words[k / 2], 0)
                      : inplace_slot_at<6>(words[k / 2] >> 6, 4);
  }
}

// The repack: word w (0..BITS-1) of a lane's block from the values q(k, c) of its pairs (k
// 0..15; c = 0: first column, 1: second), each < 2^BITS (uint32_t).
template <int BITS, typename Q>
__host__ __device__ uint32_t inplace_word(int w, Q&& q) {
  static_assert(BITS == 2 || BITS == 3 || BITS == 5 || BITS == 6 || BITS == 8,
                "in-place: 2, 3, 5, 6 or 8 bits");
  if constexpr (BITS == 8) {
    return q(2 * w, 0) | q(2 * w + 1, 0) << 8 | q(2 * w, 1) << 16 | q(2 * w + 1, 1) << 24;
  } else if constexpr (BITS == 5) {
    uint32_t v = ((q(15, 0) >> w) & 1u) << 15 | ((q(15, 1) >> w) & 1u) << 31;
    for (int s = 0; s < 3; ++s) v |= q(3 * w + s, 0) << (5 * s) | q(3 * w + s, 1) << (16 + 5 * s);
    return v;
  } else if constexpr (BITS == 6) {
    uint32_t v = 0;
    for (int c = 0; c < 2; ++c) {
      uint32_t h = q(2 * w, c) | q(2 * w + 1, c) << 10;
      if (w < 4)
        h |= (q(12 + w, c) >> 2) << 6;
      else
        h |= (q(12 + 2 * (w - 4), c) & 3u) << 6 | (q(13 + 2 * (w - 4), c) & 3u) << 8;
      v |= h << (16 * c);
    }
    return v;
  } else {
    constexpr int kPer = BITS == 2 ? 8 : 5;  // pairs at bits BITS s of word w
    uint32_t v = 0;
    for (int s = 0; s < kPer; ++s) {
      const int k = kPer * w + s;
      v |= q(k, 0) << (BITS * s) | q(k, 1) << (16 + BITS * s);
    }
    if constexpr (BITS == 3) v |= ((q(15, 0) >> w) & 1u) << 15 | ((q(15, 1) >> w) & 1u) << 31;
    return v;
  }
}

}  // namespace gyre::qlinear_detail
