#include "backend/cpu/hadamard.h"

#include <cmath>

#include "core/error.h"

namespace gyre {

int hadamard_block_for(int64_t cols) {
  for (int b : {128, 64, 32})
    if (cols > 0 && cols % b == 0) return b;
  return 0;
}

std::vector<int8_t> hadamard_random_signs(int64_t cols, uint64_t seed) {
  std::vector<int8_t> s(static_cast<size_t>(cols));
  uint64_t state = seed;
  uint64_t bits = 0;
  for (int64_t c = 0; c < cols; ++c) {
    if (c % 64 == 0) {  // splitmix64: one 64-bit draw gives 64 signs
      uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      bits = z ^ (z >> 31);
    }
    s[static_cast<size_t>(c)] = ((bits >> (c % 64)) & 1) != 0 ? int8_t{-1} : int8_t{1};
  }
  return s;
}

void hadamard_validate(const HadamardRotation& r, int64_t cols, const std::string& what) {
  GYRE_CHECK(r.block >= 2 && r.block <= 4096 && (r.block & (r.block - 1)) == 0, what,
             ": hadamard block ", r.block, " is not a power of two in 2..4096");
  GYRE_CHECK(cols > 0 && cols % r.block == 0, what, ": hadamard block ", r.block,
             " does not divide the ", cols, " input columns");
  GYRE_CHECK(static_cast<int64_t>(r.signs.size()) == cols, what, ": ", r.signs.size(),
             " hadamard signs for ", cols, " input columns");
  for (int8_t s : r.signs)
    GYRE_CHECK(s == 1 || s == -1, what, ": a hadamard sign is ", int{s}, ", not +1 or -1");
}

void fwht_blocks(float* v, int64_t n, int block) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(block));
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    float* x = v + b0;
    for (int h = 1; h < block; h *= 2)
      for (int i = 0; i < block; i += 2 * h)
        for (int j = i; j < i + h; ++j) {
          const float a = x[j], b = x[j + h];
          x[j] = a + b;
          x[j + h] = a - b;
        }
    for (int i = 0; i < block; ++i) x[i] *= scale;
  }
}

void hadamard_rotate_rows(float* x, int64_t rows, int64_t cols, const HadamardRotation& r) {
  for (int64_t i = 0; i < rows; ++i) {
    float* row = x + i * cols;
    for (int64_t c = 0; c < cols; ++c) row[c] *= r.signs[static_cast<size_t>(c)];
    fwht_blocks(row, cols, r.block);
  }
}

void hadamard_unrotate_rows(float* w, int64_t rows, int64_t cols, const HadamardRotation& r) {
  for (int64_t i = 0; i < rows; ++i) {
    float* row = w + i * cols;
    fwht_blocks(row, cols, r.block);
    for (int64_t c = 0; c < cols; ++c) row[c] *= r.signs[static_cast<size_t>(c)];
  }
}

}  // namespace gyre
