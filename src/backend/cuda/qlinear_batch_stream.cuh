// The serving-batch kernel's weight formats (qlinear_batch_stream.cu): what a warp's ring slot
// holds, how it is fetched, and how one unit of it meets the staged x on tensor cores.
#pragma once
#include <cstdint>

#include "backend/cuda/qlinear_inplace.cuh"
#include "backend/cuda/qlinear_kernels.cuh"
#include "backend/cuda/qlinear_stream.cuh"
#include "backend/cuda/qlinear_trellis.cuh"

namespace gyre::qlinear_detail {

constexpr int kBatchXPad = 32;  // halves after each x row: rows 64 bytes apart mod 128

// Blocks per unit of the kernel: min(S, 2), one trellis piece, and two one-block pieces of 2 or 3
// bits (2 bits at S 1 served 8 / 32 requests at 4.3 / 6.8 ms a step in one-block units against
// 2.8 / 4.0 at S 4, H100, session 33: a unit's fixed work (scales, loop) weighs on so few bytes).
// Weights whose count of blocks is not a multiple of it are not taken (plan(): odd counts at 2/3
// bits, e.g. SmolLM2's 576 columns, run the GEMV per 8 tokens).
__host__ __device__ constexpr int batch_unit_blocks(int bits, int s) {
  return s == 0 ? 1 : s >= 2 ? 2 : bits <= 3 ? 2 : 1;
}

// The weights of one instantiation: 4-bit tiled words (BITS 4, S 1), tiled 2/3/5/6-bit pieces of
// S blocks in the in-place arrangement (per 16-row tile 128 BITS S bytes: each lane's low-plane
// words, then each lane's high-plane ones), or (S 0) trellis-coded pieces of K = BITS bits per
// weight (qlinear_trellis.cuh: 4 tiles of 16 columns, a scale per tile's group). The kernel
// walks units of kU = batch_unit_blocks(BITS, S) blocks (64 kU columns; one piece for trellis):
// with whole pieces of 4 or 8 blocks in a 2-deep register ring, their scales (two words per block
// at g32, twice that with mins) spilled; 2/3-bit pieces of one block go two to a unit. Trellis B
// fragments are read 4 bytes at a time, so their staged x rows are padded to 4 banks apart (kPad 8
// halves) instead of 16 bytes' worth. (Outside the unnamed namespace: nvcc warns about static
// members of its classes that an instantiation leaves unused.)
template <int BITS, int S>
struct BatchPiece {
  static constexpr bool kTrellis = S == 0;
  static constexpr int kLo = StreamPlanes<BITS>::kLo, kHi = StreamPlanes<BITS>::kHi;
  static constexpr int kU = batch_unit_blocks(BITS, S), kCols = 64 * kU;
  static constexpr int kBytes = 128 * BITS * (S == 0 ? 1 : S);
  static constexpr int kDepth = kU >= 2 ? 2 : 4;  // units in flight per warp (round 5: 4 blocks)
  static constexpr int kPad = S == 0 ? 8 : kBatchXPad;
};

template <int BITS, int S, int MT, bool G32, bool ASYM>
struct BatchSlot {
  static constexpr int kU = BatchPiece<BITS, S>::kU;
  static constexpr int kScales = S == 0 ? kPieceTiles : kU * (G32 ? 2 : 1);
  uint32_t q[MT][BITS * kU];           // low-plane words of the unit's blocks, then high-plane ones
  uint32_t s[MT][kScales];             // f16 (row g, row g + 8) per group of each block
  uint32_t m[MT][ASYM ? kScales : 1];  // same for the mins (unused when symmetric)
};

__device__ __forceinline__ uint32_t batch_scale_pair(const void* base, bool f32, int64_t idx) {
  if (f32) {
    const float2 v = __ldg(reinterpret_cast<const float2*>(static_cast<const float*>(base) + idx));
    const __half2 h = __floats2half2_rn(v.x, v.y);
    uint32_t r;
    memcpy(&r, &h, 4);
    return r;
  }
  return __ldg(reinterpret_cast<const unsigned int*>(static_cast<const __half*>(base) + idx));
}

// Unit u of tiles[] (the warp's MT 16-row tiles) into the ring slot d: the lane's words and the
// scales (and mins) of rows g, g + 8 of each group.
template <int BITS, int S, int MT, bool G32, bool ASYM>
__device__ __forceinline__ void batch_fetch(const Params& p, const int (&tiles)[MT], int u,
                                            int lane, int g, BatchSlot<BITS, S, MT, G32, ASYM>& d) {
  using Pc = BatchPiece<BITS, S>;
  constexpr int kGroups = G32 ? 2 : 1;  // scale groups per 64-column block
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    if constexpr (Pc::kTrellis) {
      load_piece<BITS>(reinterpret_cast<const uint32_t*>(
                           p.qweight + (int64_t{tiles[mt]} * p.kblocks + u) * Pc::kBytes),
                       lane, d.q[mt]);
#pragma unroll
      for (int s = 0; s < kPieceTiles; ++s) {
        const int gi = ((kPieceTiles * u + s) * kTrellisTileDim) >> p.group_log2;
        d.s[mt][s] =
            batch_scale_pair(p.scales, false, (int64_t{tiles[mt]} * p.groups_p + gi) * 16 + 2 * g);
      }
    } else {
      // block b0 = u kU is block k0 of its piece; the lane's words of a block are contiguous
      constexpr int kS = S == 0 ? 1 : S;
      const int b0 = u * Pc::kU, k0 = b0 % kS;
      const uint8_t* base =
          p.qweight + (int64_t{tiles[mt]} * (p.kblocks / kS) + b0 / kS) * Pc::kBytes;
      if constexpr (kS >= Pc::kU) {
        load_stream_words<Pc::kLo * Pc::kU>(base + (lane * kS + k0) * 4 * Pc::kLo, d.q[mt]);
        if constexpr (Pc::kHi > 0)
          load_stream_words<Pc::kHi * Pc::kU>(
              base + 128 * Pc::kLo * kS + (lane * kS + k0) * 4 * Pc::kHi,
              d.q[mt] + Pc::kLo * Pc::kU);
      } else {  // kU one-block pieces, kBytes apart: each block's words where the slot has them
#pragma unroll
        for (int sb = 0; sb < Pc::kU; ++sb) {
          load_stream_words<Pc::kLo>(base + sb * Pc::kBytes + lane * 4 * Pc::kLo,
                                     d.q[mt] + sb * Pc::kLo);
          if constexpr (Pc::kHi > 0)
            load_stream_words<Pc::kHi>(base + sb * Pc::kBytes + 128 * Pc::kLo + lane * 4 * Pc::kHi,
                                       d.q[mt] + Pc::kLo * Pc::kU + sb * Pc::kHi);
        }
      }
#pragma unroll
      for (int sb = 0; sb < Pc::kU; ++sb) {
        const int b = b0 + sb, gi = G32 ? 2 * b : (64 * b) >> p.group_log2;
#pragma unroll
        for (int k = 0; k < kGroups; ++k) {
          const int64_t idx = (int64_t{tiles[mt]} * p.groups_p + gi + k) * 16 + 2 * g;
          d.s[mt][sb * kGroups + k] = batch_scale_pair(p.scales, p.scale_f32, idx);
          if constexpr (ASYM)
            d.m[mt][sb * kGroups + k] = batch_scale_pair(p.mins, p.scale_f32, idx);
        }
      }
    }
  }
}

// Trellis piece i of the staged range into acc [MT][NT][4]: each tile's fragment holds 1536 +
// code (exact), taken back to the code, scaled; B in natural column order (columns 16 s + 2 t and
// 16 s + 8 + 2 t of token 8 nt + g).
template <int BITS, int MT, int NT>
__device__ __forceinline__ void batch_compute_trellis(float* acc,
                                                      const BatchSlot<BITS, 0, MT, false, false>& d,
                                                      const __half* xs, int stride, int i, int g,
                                                      int t) {
  uint32_t nb[MT][BITS];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) neighbour_words<BITS>(d.q[mt], nb[mt]);
  const __half* xb = xs + g * stride + 64 * i + 2 * t;  // token 8 nt + g
  const __half2 c1536 = __float2half2_rn(1536.f), zero = __float2half2_rn(0.f);
#pragma unroll
  for (int s = 0; s < kPieceTiles; ++s) {
    uint4 x[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      x[nt].x = *reinterpret_cast<const uint32_t*>(xb + 8 * nt * stride + 16 * s);
      x[nt].y = *reinterpret_cast<const uint32_t*>(xb + 8 * nt * stride + 16 * s + 8);
      x[nt].z = x[nt].w = 0u;
    }
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      uint32_t raw[4];
      tile_fragment<BITS>(d.q[mt], nb[mt], s, raw);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const __half2 code = __hsub2(as_half2(raw[r]), c1536);
        memcpy(&raw[r], &code, 4);
      }
      const __half2 sc = as_half2(d.s[mt][s]);
      scale_fragment(raw, __low2half2(sc), __high2half2(sc), zero, zero, a[mt]);
    }
    mma_tiles<MT, NT>(acc, a, 0, x);
  }
}

// Unit i of the staged range (4-bit words, or 2/3/5/6-bit pieces) into acc [MT][NT][4]: each
// block's two 32-column halves, each two m16n8k16 steps, the A fragments decoded (q - offset),
// scaled (and shifted by the min) in FP16.
template <int BITS, int S, int MT, int NT, bool G32, bool ASYM>
__device__ __forceinline__ void batch_compute_scalar(float* acc,
                                                     const BatchSlot<BITS, S, MT, G32, ASYM>& d,
                                                     const __half* xs, int stride, int i, int g,
                                                     int t) {
  using Pc = BatchPiece<BITS, S>;
  constexpr int kGroups = G32 ? 2 : 1;
  // 4 bits: int4_word_to_fragment's bases; 2/3/5/6 bits: the in-place decode's offset.
  const __half2 lo_base = __float2half2_rn(ASYM ? 1024.f : 1032.f);
  const __half2 hi_base = __float2half2_rn(ASYM ? -64.f : -72.f);
  constexpr uint32_t kOffset = ASYM ? 0u : 1u << (BITS - 1);
#pragma unroll
  for (int sb = 0; sb < Pc::kU; ++sb) {
    const __half* xb = xs + g * stride + Pc::kCols * i + 64 * sb + 8 * t;  // token 8 nt + g
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint4 x[NT];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        x[nt] = *reinterpret_cast<const uint4*>(xb + 8 * nt * stride + 32 * h);
      __half2 s_lo[MT], s_hi[MT], m_lo[MT], m_hi[MT];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int k = sb * kGroups + (G32 ? h : 0);
        const __half2 sc = as_half2(d.s[mt][k]);
        s_lo[mt] = __low2half2(sc);
        s_hi[mt] = __high2half2(sc);
        m_lo[mt] = m_hi[mt] = __float2half2_rn(0.f);
        if constexpr (ASYM) {
          const __half2 m = as_half2(d.m[mt][k]);
          m_lo[mt] = __low2half2(m);
          m_hi[mt] = __high2half2(m);
        }
      }
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          uint32_t raw[4];
          if constexpr (BITS == 4)
            int4_word_to_fragment(d.q[mt][2 * h + jj], lo_base, hi_base, raw);
          else
            inplace_to_fragment<BITS, kOffset>(
                d.q[mt] + sb * Pc::kLo, d.q[mt] + Pc::kLo * Pc::kU + sb * Pc::kHi, 2 * h + jj, raw);
          scale_fragment(raw, s_lo[mt], s_hi[mt], m_lo[mt], m_hi[mt], a[mt]);
        }
        mma_tiles<MT, NT>(acc, a, jj, x);
      }
    }
  }
}

}  // namespace gyre::qlinear_detail
