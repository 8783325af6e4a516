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
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace gyre {

struct QuantSetting {
  int bits = 4;          // 2, 3, 4, 5, 6 or 8
  int group_size = 128;  // 32, 64 or 128
  bool sym = true;

  int qmax() const { return (1 << bits) - 1; }
  int offset() const { return 1 << (bits - 1); }
  // Stored bits per weight: the integers plus f16 scales (and mins) per group.
  double bits_per_weight() const { return bits + (sym ? 16.0 : 32.0) / group_size; }
  std::string str() const;  // "4b g128 sym"
  bool operator==(const QuantSetting&) const = default;
};

// Throws unless bits and group size are supported and cols fits the group size.
void quant_setting_validate(const QuantSetting& s, int64_t cols, const std::string& what);

// The float value of stored integer q with scale s and min m (m unused when symmetric).
float quant_dequant_value(const QuantSetting& st, int q, float s, float m);

// Bit-stream packing of one row of cols integers (each < 2^bits) into cols * bits / 32 words.
void quant_pack_row(const int* q, int64_t cols, int bits, uint32_t* words);
int quant_unpack(const uint32_t* words, int64_t c, int bits);

}  // namespace gyre
