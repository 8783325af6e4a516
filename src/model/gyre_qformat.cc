#include "model/gyre_qformat.h"

#include <sstream>

#include "core/error.h"

// Dequantization must round exactly as GGUF's Q4_0/Q4_1/Q8_0 does (multiply, then add), so that
// a layer repacked into those blocks at load gives the same floats: no FMA contraction.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace gyre {

std::string QuantSetting::str() const {
  std::ostringstream os;
  os << bits << "b g" << group_size << (sym ? " sym" : " asym");
  return os.str();
}

void quant_setting_validate(const QuantSetting& s, int64_t cols, const std::string& what) {
  GYRE_CHECK(s.bits == 2 || s.bits == 3 || s.bits == 4 || s.bits == 5 || s.bits == 6 || s.bits == 8,
             what, ": bits must be 2, 3, 4, 5, 6 or 8, got ", s.bits);
  GYRE_CHECK(s.group_size == 32 || s.group_size == 64 || s.group_size == 128, what,
             ": group size must be 32, 64 or 128, got ", s.group_size);
  GYRE_CHECK(cols > 0 && cols % s.group_size == 0, what, ": ", cols,
             " columns are not a positive multiple of the group size ", s.group_size);
}

float quant_dequant_value(const QuantSetting& st, int q, float s, float m) {
  if (st.sym) return s * static_cast<float>(q - st.offset());
  return s * static_cast<float>(q) + m;
}

void quant_pack_row(const int* q, int64_t cols, int bits, uint32_t* words) {
  const int64_t n_words = cols * bits / 32;
  for (int64_t i = 0; i < n_words; ++i) words[i] = 0;
  for (int64_t c = 0; c < cols; ++c) {
    const int64_t bit = c * bits;
    const uint64_t v = static_cast<uint64_t>(q[c]) << (bit % 32);
    words[bit / 32] |= static_cast<uint32_t>(v);
    if ((bit % 32) + bits > 32) words[bit / 32 + 1] |= static_cast<uint32_t>(v >> 32);
  }
}

int quant_unpack(const uint32_t* words, int64_t c, int bits) {
  const int64_t bit = c * bits;
  uint64_t v = words[bit / 32];
  if ((bit % 32) + bits > 32) v |= static_cast<uint64_t>(words[bit / 32 + 1]) << 32;
  return static_cast<int>((v >> (bit % 32)) & ((1u << bits) - 1));
}

}  // namespace gyre
