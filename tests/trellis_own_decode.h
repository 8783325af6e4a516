// Trellis-coded tiles decoded from the format's definition (backend/cpu/trellis.h's comment),
// bit by bit and independently of the library's decoder: the tests' oracle for the converter.
#pragma once
#include <cstdint>
#include <vector>

namespace gyre::trellis_test {

inline int own_code(uint32_t s) {
  const uint32_t u = s * 0x2C9277B5u + 0x7F4A7C15u;
  int sum = 0;
  for (int i = 0; i < 4; ++i) sum += static_cast<int8_t>(static_cast<uint8_t>(u >> (8 * i)));
  return sum;
}

// Position p's (row, col) in its tile: lane l = p / 8 holds register j = p % 8 of the m16n8k16
// A fragment: rows g, g + 8 (g = l / 4), columns 2t, 2t + 1 and their + 8 (t = l % 4).
inline void own_position(int p, int& row, int& col) {
  const int l = p / 8, j = p % 8;
  const int rows[8] = {0, 0, 8, 8, 0, 0, 8, 8}, cols[8] = {0, 1, 0, 1, 8, 9, 8, 9};
  row = l / 4 + rows[j];
  col = 2 * (l % 4) + cols[j];
}

// The 16-bit state at position p of a tile's 8K words, bit by bit, circularly.
inline uint32_t own_state(const uint32_t* words, int k, int p) {
  const int nbits = 256 * k;
  uint32_t s = 0;
  for (int i = 0; i < 16; ++i) {
    const int b = (k * p + i) % nbits;
    s |= ((words[b / 32] >> (b % 32)) & 1u) << i;
  }
  return s;
}

// Codes [rows][cols] of a weight's tiles (tile-row major, 8K words each).
inline std::vector<int> own_codes(const std::vector<uint32_t>& words, int rows, int cols, int k) {
  std::vector<int> out(static_cast<size_t>(rows) * cols);
  const int tc_n = cols / 16;
  for (int tr = 0; tr < rows / 16; ++tr)
    for (int tc = 0; tc < tc_n; ++tc) {
      const uint32_t* w = words.data() + (size_t(tr) * tc_n + tc) * 8 * k;
      for (int p = 0; p < 256; ++p) {
        int r = 0, c = 0;
        own_position(p, r, c);
        out[size_t(tr * 16 + r) * cols + tc * 16 + c] = own_code(own_state(w, k, p));
      }
    }
  return out;
}

}  // namespace gyre::trellis_test
