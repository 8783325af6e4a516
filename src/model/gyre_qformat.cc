#include "model/gyre_qformat.h"

#include <algorithm>
#include <cmath>
#include <numeric>
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
  if (trellis) {
    os << bits << "b trellis g" << group_size;
    return os.str();
  }
  os << bits << "b g" << group_size << (sym ? " sym" : " asym");
  if (mixed()) os << " +" << mix_eighths << "/8 " << mix_bits << "b";
  return os.str();
}

int64_t QuantSetting::mix_groups(int64_t cols) const {
  if (!mixed()) return 0;
  const int64_t groups = cols / group_size;
  const auto k = static_cast<int64_t>(std::llround(static_cast<double>(groups) * mix_eighths / 8));
  return std::clamp<int64_t>(k, 1, groups - 1);
}

double QuantSetting::stored_bits(int64_t rows, int64_t cols) const {
  const double per_group_meta = sym ? 16.0 : 32.0;
  const double n = static_cast<double>(rows) * static_cast<double>(cols);
  const auto hi_cols = static_cast<double>(mix_groups(cols) * group_size);
  return n * (bits + per_group_meta / group_size) +
         static_cast<double>(rows) * hi_cols * (mix_bits - bits) + 32.0 * mix_groups(cols);
}

std::vector<int> mix_hi_groups(const QuantSetting& s, const double* energy, int64_t cols) {
  const int64_t k = s.mix_groups(cols), groups = cols / s.group_size;
  if (k == 0) return {};
  std::vector<double> sum(static_cast<size_t>(groups), 0.0);
  for (int64_t c = 0; c < groups * s.group_size; ++c) sum[c / s.group_size] += energy[c];
  std::vector<int> order(static_cast<size_t>(groups));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sum[a] > sum[b]; });
  order.resize(static_cast<size_t>(k));
  std::sort(order.begin(), order.end());
  return order;
}

void quant_setting_validate(const QuantSetting& s, int64_t cols, const std::string& what) {
  GYRE_CHECK(s.bits == 2 || s.bits == 3 || s.bits == 4 || s.bits == 5 || s.bits == 6 || s.bits == 8,
             what, ": bits must be 2, 3, 4, 5, 6 or 8, got ", s.bits);
  GYRE_CHECK(s.group_size == 32 || s.group_size == 64 || s.group_size == 128, what,
             ": group size must be 32, 64 or 128, got ", s.group_size);
  GYRE_CHECK(cols > 0 && cols % s.group_size == 0, what, ": ", cols,
             " columns are not a positive multiple of the group size ", s.group_size);
  if (s.mixed()) {
    quant_setting_validate(s.part(true), cols, what + " (mix)");
    GYRE_CHECK(s.mix_bits != s.bits && s.mix_eighths >= 1 && s.mix_eighths <= 7, what,
               ": a mix needs a second width and a share of 1..7 eighths, got ", s.mix_bits,
               " bits at ", s.mix_eighths, "/8");
    GYRE_CHECK(cols / s.group_size >= 2, what, ": a mix needs at least two groups, ", cols,
               " columns have ", cols / s.group_size);
  } else {
    GYRE_CHECK(s.mix_eighths == 0, what, ": a mix share without a mix width");
  }
  if (s.trellis) {
    // The group sizes above are all multiples of the 16-column tile, so cols is one too.
    GYRE_CHECK(s.sym && !s.mixed(), what,
               ": a trellis setting is symmetric and has no mix of two widths");
  }
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
