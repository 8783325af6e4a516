// Trellis-coded weights inside Gyre's packed-weight type (QWeightDesc::trellis, qlinear_ref.h):
// validation, where a tile's words live, and the float reference dequantizer.
#pragma once
#include <cstdint>

#include "backend/cpu/qlinear_ref.h"

namespace gyre {

// Throws unless bits is a supported K, rows and cols are multiples of 16, the group is a
// multiple of 16 in 16..256 dividing cols, and the weight is symmetric with f16 scales and no
// permutation.
void trellis_validate(const QWeightDesc& d);

// The 8K words of tile (tr, tc) (tile-row major, backend/cpu/trellis.h).
const uint32_t* trellis_tile(const QWeightHost& w, int64_t tr, int64_t tc);
uint32_t* trellis_tile(QWeightHost& w, int64_t tr, int64_t tc);

// Row r as stored (in the rotated space of a rotated weight): scale * code, in float.
void trellis_dequantize_row(const QWeightHost& w, int64_t r, float* out);

}  // namespace gyre
