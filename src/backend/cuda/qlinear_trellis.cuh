// The device decode of trellis-coded weights in the CUDA layout of qlinear_trellis.cu (which says
// how lanes hold a piece's bits and how a state becomes a code): shared by the decode GEMV there
// and the serving-batch kernel (qlinear_batch_stream.cu).
#pragma once
#include <cstdint>

#include "backend/cpu/trellis.h"
#include "backend/cuda/qlinear_stream.cuh"

namespace gyre::qlinear_detail {

inline constexpr int kPieceTiles = 4;  // tiles (of 16 columns) per piece
inline constexpr int kPieceCols = kPieceTiles * kTrellisTileDim;

// Words per load unit: the widest of 4, 2, 1 that divides K.
constexpr int trellis_unit(int k) {
  return k % 4 == 0 ? 4 : k % 2 == 0 ? 2 : 1;
}

// Whether the neighbour's lane-vector word w carries bits some tile of the piece needs (the
// first 16 - K bits of each tile's segment, at bit 8Ks).
constexpr bool trellis_needs_word(int k, int w) {
  for (int s = 0; s < kPieceTiles; ++s) {
    const int lo = 8 * k * s, hi = lo + 16 - k;  // [lo, hi)
    if (lo < 32 * (w + 1) && hi > 32 * w) return true;
  }
  return false;
}

// n (<= 16) bits of a lane vector at the compile-time-known offset off (after unrolling).
template <int K>
__device__ __forceinline__ uint32_t vec_bits(const uint32_t (&v)[K], int off, int n) {
  const int w = off >> 5, sh = off & 31;
  uint32_t x = v[w] >> sh;
  if (sh + n > 32) x = __funnelshift_r(v[w], w + 1 < K ? v[w + 1] : 0u, sh);
  return n >= 32 ? x : x & ((1u << n) - 1);
}

// State of position j of tile s of the piece: own vector v, neighbour lane's vector nb.
template <int K>
__device__ __forceinline__ uint32_t piece_state(const uint32_t (&v)[K], const uint32_t (&nb)[K],
                                                int s, int j) {
  const int off = 8 * K * s + K * j, own = K * (8 - j);  // own bits left in the segment
  if (own >= 16) return vec_bits<K>(v, off, 16);
  return vec_bits<K>(v, off, own) | (vec_bits<K>(nb, 8 * K * s, 16 - own) << own);
}

// f16 bits of 1536 + code(state) in the low half.
__device__ __forceinline__ uint32_t code_1536(uint32_t state) {
  return static_cast<uint32_t>(
      __dp4a(static_cast<int>(state * kTrellisMul + kTrellisAdd), 0x01010101, 0x6400 + 512));
}

// The 16-bit states of tile s, positions 0..7.
template <int K>
__device__ __forceinline__ void tile_states(const uint32_t (&v)[K], const uint32_t (&nb)[K], int s,
                                            uint32_t (&st)[8]) {
  if constexpr (K == 4) {
    // One word per tile and 4-bit steps: byte permutes against zero pick byte-aligned windows,
    // the odd positions come from the window shifted by 4 (10 instructions for 8 states instead
    // of a shift and a mask each, plus the neighbour's merge).
    const uint32_t w = v[s], n12 = nb[s] & 0xFFFu;   // the neighbour's 12 bits
    const uint32_t w4 = __funnelshift_r(w, n12, 4);  // bits 4..35
    st[0] = w & 0xFFFFu;
    st[1] = __byte_perm(w4, 0u, 0x4410);
    st[2] = __byte_perm(w, 0u, 0x4421);
    st[3] = __byte_perm(w4, 0u, 0x4421);
    st[4] = w >> 16;
    st[5] = __byte_perm(w4, 0u, 0x4432);
    st[6] = __byte_perm(w, n12, 0x7643);  // bits 24..39: byte 3, then n12's low byte, zeros
    st[7] = __funnelshift_r(w, n12, 28);  // bits 28..43 (n12 < 2^12: nothing above bit 15)
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) st[j] = piece_state<K>(v, nb, s, j);
  }
}

// The A fragment of tile s (registers a0..a3 = positions 0-1, 2-3, 4-5, 6-7) holding 1536 + code,
// exact in f16: the 1536 is taken out of the accumulator at each group's end (an MMA of x with
// ones gives the sums it multiplies), which is cheaper than one HSUB2 per pair.
template <int K>
__device__ __forceinline__ void tile_fragment(const uint32_t (&v)[K], const uint32_t (&nb)[K],
                                              int s, uint32_t a[4]) {
  uint32_t st[8];
  tile_states<K>(v, nb, s, st);
#pragma unroll
  for (int r = 0; r < 4; ++r)
    a[r] = __byte_perm(code_1536(st[2 * r]), code_1536(st[2 * r + 1]), 0x5410);
}

// The lane vectors: own, then the neighbour's (lane + 1, circular) words that the piece needs.
template <int K>
__device__ __forceinline__ void neighbour_words(const uint32_t (&v)[K], uint32_t (&nb)[K]) {
  const int src = (threadIdx.x + 1) & 31;
#pragma unroll
  for (int w = 0; w < K; ++w) nb[w] = trellis_needs_word(K, w) ? __shfl_sync(~0u, v[w], src) : 0u;
}

template <int K>
__device__ __forceinline__ void load_piece(const uint32_t* piece, int lane, uint32_t (&v)[K]) {
  constexpr int U = trellis_unit(K);
#pragma unroll
  for (int u = 0; u < K / U; ++u)
    load_stream_words<U>(reinterpret_cast<const uint8_t*>(piece + (32 * u + lane) * U), v + u * U);
}

}  // namespace gyre::qlinear_detail
