#include "backend/cpu/trellis.h"

namespace gyre {

void trellis_decode_tile(const uint32_t* words, int k, int16_t* codes) {
  for (int p = 0; p < kTrellisTileElems; ++p) {
    int r = 0, c = 0;
    trellis_position(p, r, c);
    codes[r * kTrellisTileDim + c] = int16_t(trellis_code(trellis_state(words, k, p)));
  }
}

}  // namespace gyre
