// Gyre's trellis-coded weights: the decoder side (the encoder is quant/trellis_encode.h).
//
// Trellis-coded quantization (TCQ) after QTIP (Tseng et al., 2024: a "bitshift" trellis whose
// codebook is computed, not stored), with Gyre's own codebook and tile order. At K bits per
// weight it reaches about half the squared error of the best scalar (Lloyd-Max) quantizer on
// Gaussian data (measured: 4 bits 0.0044 vs 0.0095, 2 bits 0.065 vs 0.118), which is why
// ExLlamaV3 moved to it. It needs Gaussian-like weights: Gyre always pairs it with the input
// Hadamard rotation of backend/cpu/hadamard.h.
//
// Tiles. A weight W [rows, cols] (rows and cols multiples of 16) is cut into 16 x 16 tiles,
// stored tile-row major: tile (tr, tc) is tile number tr * (cols / 16) + tc. Each tile is one
// trellis sequence of 256 positions p, and position p = 8 * l + j (l = 0..31, j = 0..7) holds
// the element the m16n8k16 tensor-core A fragment gives lane l as its register j:
//   g = l / 4, t = l % 4
//   j = 0: (g, 2t)   1: (g, 2t+1)   2: (g+8, 2t)   3: (g+8, 2t+1)
//   j = 4: (g, 2t+8) 5: (g, 2t+9)   6: (g+8, 2t+8) 7: (g+8, 2t+9)     (row, col) in the tile
// so a GPU lane decodes exactly its own fragment from one contiguous run of bits.
//
// Bit stream. A tile is 256 * K bits = 8K little-endian u32 words; stream bit b is bit (b % 32)
// of word b / 32. The state of position p is the 16-bit window starting at bit K * p, read
// circularly (tail-biting: bit indices mod 256K), least significant bit first:
//   state_p = sum_{i<16} bit((K p + i) mod 256K) << i
// Consecutive states overlap in 16 - K bits (state_{p+1} = state_p >> K | new bits << (16 - K)).
//
// Codebook. code(s) = the sum of the four signed bytes of u = s * kTrellisMul + kTrellisAdd
// (mod 2^32): an integer in [-512, 508] (observed over all states: -490..485, RMS 148.03),
// close to Gaussian (a sum of four near-uniform bytes) and two instructions on a GPU
// (IMAD, IDP4A). Against a random Gaussian codebook of 65536 entries it costs ~4% of MSE.
//
// Value. With f16 scales per row and group of `group` columns (a multiple of 16, 32..128):
//   w[r][c] = scale[r][c / group] * float(code(state))    (one float multiply)
// Codes are small integers, so they are exact in f16 (the GPU's tensor-core input).
#pragma once
#include <cstdint>

namespace gyre {

constexpr int kTrellisStateBits = 16;
constexpr int kTrellisTileDim = 16;
constexpr int kTrellisTileElems = 256;
constexpr uint32_t kTrellisMul = 0x2C9277B5u;
constexpr uint32_t kTrellisAdd = 0x7F4A7C15u;
// sqrt(mean(code(s)^2)) over all 65536 states: the scale that gives codes unit RMS.
constexpr double kTrellisCodeRms = 148.0336;

// Supported bits per weight.
inline bool trellis_bits_supported(int k) {
  return (k >= 2 && k <= 6) || k == 8;
}
// u32 words per tile.
inline int trellis_tile_words(int k) {
  return 8 * k;
}

inline int trellis_code(uint32_t state) {
  const uint32_t u = (state & 0xFFFFu) * kTrellisMul + kTrellisAdd;
  return int(int8_t(u & 0xFF)) + int(int8_t((u >> 8) & 0xFF)) + int(int8_t((u >> 16) & 0xFF)) +
         int(int8_t(u >> 24));
}

// (row, col) inside the tile of sequence position p (see the table above).
inline void trellis_position(int p, int& row, int& col) {
  const int l = p >> 3, j = p & 7, g = l >> 2, t = l & 3;
  row = g + ((j & 2) ? 8 : 0);
  col = 2 * t + (j & 1) + ((j & 4) ? 8 : 0);
}

// state_p of a tile's words (8K of them).
inline uint32_t trellis_state(const uint32_t* words, int k, int p) {
  const int nbits = 256 * k;
  const int b = k * p;
  const int w = b >> 5, sh = b & 31;
  const uint64_t lo = words[w], hi = words[(w + 1) % (nbits >> 5)];
  uint64_t win = lo | (hi << 32);
  // The window may need a third word only when 16 bits cross two boundaries, which cannot
  // happen (16 <= 32); it wraps to word 0 at the end of the stream.
  return uint32_t(win >> sh) & 0xFFFFu;
}

// The 256 codes of one tile in row-major tile order (codes[row * 16 + col]).
void trellis_decode_tile(const uint32_t* words, int k, int16_t* codes);

}  // namespace gyre
