#include "backend/cpu/trellis_layout.h"

#include "backend/cpu/trellis.h"
#include "core/error.h"

namespace gyre {

void trellis_validate(const QWeightDesc& d) {
  GYRE_CHECK(trellis_bits_supported(d.bits),
             "trellis weight: bits must be 2, 3, 4, 5, 6 or 8, got ", d.bits);
  const int g = d.group_size;
  GYRE_CHECK(g >= 16 && g <= 256 && g % 16 == 0,
             "trellis weight: group size must be a multiple of 16 in 16..256, got ", g);
  GYRE_CHECK(d.rows > 0 && d.cols > 0 && d.rows % 16 == 0 && d.cols % 16 == 0,
             "trellis weight: shape [", d.rows, ", ", d.cols, "] is not made of 16 x 16 tiles");
  GYRE_CHECK(d.cols % g == 0, "trellis weight: ", d.cols,
             " columns are not a multiple of the group size ", g);
  GYRE_CHECK(!d.asymmetric && !d.scale_f32 && !d.has_perm,
             "trellis weight: must be symmetric with f16 scales and no permutation");
}

const uint32_t* trellis_tile(const QWeightHost& w, int64_t tr, int64_t tc) {
  const int64_t tile = tr * (w.desc.cols / kTrellisTileDim) + tc;
  return reinterpret_cast<const uint32_t*>(w.qweight.data()) +
         tile * trellis_tile_words(w.desc.bits);
}

uint32_t* trellis_tile(QWeightHost& w, int64_t tr, int64_t tc) {
  return const_cast<uint32_t*>(trellis_tile(static_cast<const QWeightHost&>(w), tr, tc));
}

void trellis_dequantize_row(const QWeightHost& w, int64_t r, float* out) {
  const QWeightDesc& d = w.desc;
  const int64_t tr = r / kTrellisTileDim;
  const int in_row = int(r % kTrellisTileDim);
  // The 16 sequence positions of tile row in_row (trellis.h's fragment table: lanes 4g..4g+3 with
  // g = in_row % 8, registers j with bit 1 set for the lower 8 rows), so a row costs 16 decodes
  // per tile rather than a scan of all 256 positions.
  int positions[kTrellisTileDim];
  int n = 0;
  for (int t = 0; t < 4; ++t)
    for (int j : {0, 1, 4, 5}) positions[n++] = 8 * (4 * (in_row & 7) + t) + j + (in_row & 8) / 4;
  for (int64_t tc = 0; tc < d.cols / kTrellisTileDim; ++tc) {
    const uint32_t* words = trellis_tile(w, tr, tc);
    for (int p : positions) {
      int row = 0, col = 0;
      trellis_position(p, row, col);
      const int64_t c = tc * kTrellisTileDim + col;
      out[c] = w.scale(r, c / d.group_size) * float(trellis_code(trellis_state(words, d.bits, p)));
    }
  }
}

}  // namespace gyre
