// Gyre's own quantized weight format (written by `gyre convert`, src/quant/), shared by the
// writer and the loader. A quantized linear weight NAME.weight [rows, cols] is stored as
//   NAME.qweight  I32 [rows, cols * bits / 32]: each row a little-endian bit stream, element c at
//                 bits [c * bits, (c + 1) * bits) of the row (crossing word boundaries as needed)
//   NAME.scales   F16 [rows, cols / group]
//   NAME.mins     F16 [rows, cols / group], only when asymmetric
// with q the unsigned stored integer and s, m the group's scale and min (computed in float,
// multiply then add, no FMA, exactly as GGUF's Q4_0/Q4_1/Q8_0 dequantization does):
//   symmetric:  w = s * (q - 2^(bits-1))        asymmetric: w = s * q + m
// Columns stay in their original order (act-order only changes the order GPTQ visits them, see
// quant/gptq.h), so a row needs no permutation metadata.
//
// Mixed layers (quantization_config version 2; a layer entry with "mix": {"bits": B2,
// "hi_groups": K}): the K column groups with the most input energy (sum of the Hessian's
// diagonal over the group's columns, from the layer's calibration input) are stored at B2 bits,
// the others at `bits`, both with the layer's group size and symmetry. Each set is its own packed
// weight over just its columns, taken in increasing column order:
//   NAME.qweight / NAME.scales (/ NAME.mins)           the other groups' columns at `bits`
//   NAME.hi.qweight / NAME.hi.scales (/ NAME.hi.mins)  the K groups' columns at B2 bits
//   NAME.hi_groups  I32 [K]  the K group indices, strictly increasing
// y = W x is then the sum of the two parts' products with their gathered inputs
// (backend/cpu/qmixed.h), so the kernels of each width run it unchanged.
//
// Rotated layers (quantization_config version 3; a layer entry with "hadamard": B): the stored
// weight is quant(W R) with R = diag(s) blockdiag(H_B) (backend/cpu/hadamard.h) and the layer
// computes y = (W R)_q (R^T x). The signs s are
//   NAME.had_signs  I16 [cols]  each +1 or -1
// B is a power of two dividing cols (the converter uses the largest of 128, 64, 32). Layers
// sharing an input (q|k|v, gate|up) carry the same signs and B, so they still fuse. Everything
// else (bits, groups, mixes) is as above, in the rotated column space.
//
// Trellis layers (quantization_config version 4; a layer entry with "trellis": true, always with
// "hadamard": B, "sym": true, group_size = B and no mix): the weight W R [rows, cols] (rows and
// cols multiples of 16) is cut into 16 x 16 tiles coded as in backend/cpu/trellis.h at K = bits:
//   NAME.qweight   I32 [rows / 16, (cols / 16) * 8K]  row tr holds the tiles (tr, 0..cols/16-1),
//                  each its 8K little-endian words (tile number tr * (cols / 16) + tc)
//   NAME.scales    F16 [rows, cols / group]
//   NAME.had_signs I16 [cols]
// and w[r][c] = scale[r][c / group] * code(state) of the tile's position holding (r, c).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace gyre {

// quantization_config.version: 1 for files of one-width layers (readable by older builds), 2 when
// any layer is mixed, 3 when any layer is rotated (older builds must refuse such a file rather
// than run it unrotated), 4 when any layer is trellis-coded (older builds cannot decode it).
inline int quant_format_version(bool any_mix, bool any_rotated = false, bool any_trellis = false) {
  return any_trellis ? 4 : any_rotated ? 3 : any_mix ? 2 : 1;
}

struct QuantSetting {
  int bits = 4;          // 2, 3, 4, 5, 6 or 8
  int group_size = 128;  // 32, 64 or 128
  bool sym = true;
  // A mix of two widths (see above): mix_eighths / 8 of the groups (rounded, at least one and
  // at most all but one) at mix_bits; mix_bits 0 means one width.
  int mix_bits = 0;
  int mix_eighths = 0;
  // Trellis-coded (backend/cpu/trellis.h; `gyre convert --trellis`): bits = K per weight, f16
  // scales per row and group, always symmetric, never mixed, only on rotated layers whose rows
  // and cols are multiples of 16.
  bool trellis = false;

  int qmax() const { return (1 << bits) - 1; }
  int offset() const { return 1 << (bits - 1); }
  bool mixed() const { return mix_bits != 0; }
  // Groups at mix_bits in a layer of cols columns (0 when not mixed).
  int64_t mix_groups(int64_t cols) const;
  // The one-width setting of a group: mix_bits for the chosen groups (hi), else bits.
  QuantSetting part(bool hi) const { return {hi ? mix_bits : bits, group_size, sym}; }
  // Stored bits per weight of a one-width setting: the integers (or a trellis's K bits per
  // weight) plus f16 scales (and mins).
  double bits_per_weight() const { return bits + (sym ? 16.0 : 32.0) / group_size; }
  // Stored bits of a whole [rows, cols] layer: both widths' integers, the scales and mins, and
  // for a mix its I32 list of groups.
  double stored_bits(int64_t rows, int64_t cols) const;
  std::string str() const;  // "4b g128 sym", "3b g128 sym +2/8 4b", "4b trellis g128"
  bool operator==(const QuantSetting&) const = default;
};

// The groups a mix stores at mix_bits: the mix_groups(cols) groups with the largest sum of
// energy[c] over their columns (ties: the lower index), in increasing order. Empty unless mixed.
std::vector<int> mix_hi_groups(const QuantSetting& s, const double* energy, int64_t cols);

// Throws unless bits and group size (and a mix's width and share) are supported and cols fits
// the group size (a mix needs at least two groups). A trellis setting must be symmetric and
// unmixed; its group a multiple of 16 (so also cols); rows % 16 is the caller's check
// (trellis_tileable).
void quant_setting_validate(const QuantSetting& s, int64_t cols, const std::string& what);

// Whether a [rows, cols] layer can be trellis-coded: both multiples of the 16 x 16 tile.
inline bool trellis_tileable(int64_t rows, int64_t cols) {
  return rows > 0 && cols > 0 && rows % 16 == 0 && cols % 16 == 0;
}

// The float value of stored integer q with scale s and min m (m unused when symmetric).
float quant_dequant_value(const QuantSetting& st, int q, float s, float m);

// Bit-stream packing of one row of cols integers (each < 2^bits) into cols * bits / 32 words.
void quant_pack_row(const int* q, int64_t cols, int bits, uint32_t* words);
int quant_unpack(const uint32_t* words, int64_t c, int bits);

}  // namespace gyre
