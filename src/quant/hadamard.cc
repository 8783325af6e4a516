#include "quant/hadamard.h"

namespace gyre::quant {

namespace {

// FNV-1a: a stable hash (std::hash may differ between builds; the signs are stored, but a resumed
// job must rotate its remaining blocks as the first run did).
uint64_t stable_hash(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace

HadamardRotation unit_rotation(const std::string& unit, int64_t cols) {
  HadamardRotation r;
  r.block = hadamard_block_for(cols);
  if (r.block != 0) r.signs = hadamard_random_signs(cols, stable_hash(unit));
  return r;
}

}  // namespace gyre::quant
