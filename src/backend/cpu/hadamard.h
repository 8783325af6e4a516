// Random-sign block Hadamard rotations of a linear layer's input (incoherence processing, as in
// QuIP# and ExLlamaV3): R = diag(s) * blockdiag(H_B), s a vector of +-1 over the layer's cols
// input columns and H_B the orthonormal Sylvester Hadamard matrix of order B (a power of two
// dividing cols; H_B is symmetric and its own inverse). Since R is orthogonal,
//   y = W x = (W R) (R^T x),
// so a rotated layer stores quant(W R) and multiplies it by the rotated input
//   R^T x = H_B (s .* x)   (blockwise: each B-block of s .* x through a fast Walsh-Hadamard
//                           transform, scaled by 1/sqrt(B)).
// Row w of W becomes w R = (w .* s) H_B: the same transform, so one function serves both.
// Undoing it on a row (w = (w R) R^T = H_B(w R) .* s) is the transform followed by the signs.
// Rotation spreads outlier columns over their block, which makes the values of W R (and of
// R^T x) closer to Gaussian and easier to quantize at few bits.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace gyre {

// The rotation of one layer's input: empty signs = none.
struct HadamardRotation {
  std::vector<int8_t> signs;  // [cols], each +1 or -1
  int block = 0;              // B

  bool active() const { return block != 0; }
  // Written out: this header reaches the .cu files, which build as C++17.
  bool operator==(const HadamardRotation& o) const { return block == o.block && signs == o.signs; }
  bool operator!=(const HadamardRotation& o) const { return !(*this == o); }
};

// The largest of 128, 64, 32 dividing cols; 0 when none does.
int hadamard_block_for(int64_t cols);

// Deterministic random signs for a layer of cols columns from a seed (splitmix64 stream).
std::vector<int8_t> hadamard_random_signs(int64_t cols, uint64_t seed);

// Throws gyre::Error (one line, prefixed by `what`) unless block is a power of two in 2..4096
// dividing cols and signs has cols entries, each +1 or -1.
void hadamard_validate(const HadamardRotation& r, int64_t cols, const std::string& what);

// In place on each of `rows` rows of cols floats: x <- R^T x (equivalently w <- w R).
void hadamard_rotate_rows(float* x, int64_t rows, int64_t cols, const HadamardRotation& r);
// In place on each row: w <- w R^T (the inverse of hadamard_rotate_rows).
void hadamard_unrotate_rows(float* w, int64_t rows, int64_t cols, const HadamardRotation& r);

// The orthonormal fast Walsh-Hadamard transform of each block of n floats of v (n a multiple
// of block): v_blk <- H_B v_blk, with H_B[i][j] = (-1)^popcount(i & j) / sqrt(B).
void fwht_blocks(float* v, int64_t n, int block);

}  // namespace gyre
