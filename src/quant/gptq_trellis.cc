#include "quant/gptq_trellis.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/hadamard.h"
#include "backend/cpu/trellis.h"
#include "core/error.h"
#include "core/half.h"
#include "quant/linalg.h"
#include "quant/trellis_encode.h"

namespace gyre::quant {

namespace {

constexpr int kTile = kTrellisTileDim;
constexpr int kLazyBlock = 128;  // columns whose updates are applied at once (as gptq.cc)

// X U = D for X, with U [16 x 16] upper triangular (row-major, stride ldu) and D, X [16] rows of
// one tile row: x_k = (d_k - sum_{i<k} x_i U_ik) / U_kk, i.e. column-by-column GPTQ's errors.
void solve_upper_right(const double* d, const double* u, int64_t ldu, double* x) {
  for (int k = 0; k < kTile; ++k) {
    double acc = d[k];
    for (int i = 0; i < k; ++i) acc -= x[i] * u[i * ldu + k];
    x[k] = acc / u[k * ldu + k];
  }
}

}  // namespace

float trellis_group_scale(const double* v, int n) {
  double ss = 0.0;
  for (int i = 0; i < n; ++i) ss += v[i] * v[i];
  const double s = std::sqrt(ss / n) / kTrellisCodeRms * kTrellisScaleFit;
  const float h = f16_to_f32(f32_to_f16(static_cast<float>(s)));
  GYRE_CHECK(std::isfinite(h), "trellis: a group's scale overflows f16");
  return h;
}

QuantSetting trellis_setting(int bits, int64_t cols) {
  QuantSetting st;
  st.bits = bits;
  st.group_size = hadamard_block_for(cols);
  st.sym = true;
  st.trellis = st.group_size != 0;
  if (!st.trellis) st.group_size = 128;
  return st;
}

QuantizedWeight gptq_quantize_trellis(const float* w, int rows, int cols, const GptqPrep& prep,
                                      const QuantSetting& st, int threads) {
  GYRE_CHECK(st.trellis && trellis_bits_supported(st.bits), "internal: not a trellis setting");
  quant_setting_validate(st, cols, "trellis quantize");
  GYRE_CHECK(trellis_tileable(rows, cols), "trellis quantize: a [", rows, ", ", cols,
             "] weight is not made of 16 x 16 tiles");
  GYRE_CHECK(prep.cols == cols, "gptq: prepared for ", prep.cols, " columns, weight has ", cols);
  for (int j = 0; j < cols; ++j)
    GYRE_CHECK(prep.order[j] == j, "internal: trellis LDLQ needs the natural column order");
  const int k = st.bits, gs = st.group_size, groups = cols / gs, tiles_per_row = cols / kTile;
  const int words_per_tile = trellis_tile_words(k);
  QuantizedWeight out;
  out.setting = st;
  out.rows = rows;
  out.cols = cols;
  out.dequant.assign(static_cast<size_t>(rows) * cols, 0.0f);
  out.scales.assign(static_cast<size_t>(rows) * groups, 0);
  out.trellis.assign(static_cast<size_t>(rows / kTile) * tiles_per_row * words_per_tile, 0);
  const std::vector<double>& u = prep.u;
  // Rows never interact in LDLQ: each thread runs whole tile rows through all columns.
  parallel_ranges(rows / kTile, threads, [&](int64_t t0, int64_t t1) {
    const int64_t r0 = t0 * kTile, nr = (t1 - t0) * kTile;
    std::vector<double> wp(static_cast<size_t>(nr) * cols),
        err(static_cast<size_t>(nr) * kLazyBlock);
    for (int64_t r = 0; r < nr; ++r)
      for (int c = 0; c < cols; ++c) wp[r * cols + c] = prep.dead[c] ? 0.0 : w[(r0 + r) * cols + c];
    std::vector<float> scale(static_cast<size_t>(nr) * groups, 0.0f);
    float target[kTrellisTileElems], pos_scale[kTrellisTileElems];
    int pos_row[kTrellisTileElems], pos_col[kTrellisTileElems];
    for (int p = 0; p < kTrellisTileElems; ++p) trellis_position(p, pos_row[p], pos_col[p]);
    double diff[kTile];
    for (int i1 = 0; i1 < cols; i1 += kLazyBlock) {
      const int i2 = std::min(cols, i1 + kLazyBlock);
      for (int j = i1; j < i2; j += kTile) {
        const int g = j / gs;
        // A group lies inside one 128-column block (gs divides 128 and cols), so at its first
        // block its columns hold every update made so far.
        if (j % gs == 0)
          for (int64_t r = 0; r < nr; ++r)
            scale[r * groups + g] = trellis_group_scale(wp.data() + r * cols + j, gs);
        const double* ubb = u.data() + int64_t{j} * cols + j;
        for (int64_t tr = 0; tr < nr / kTile; ++tr) {
          for (int p = 0; p < kTrellisTileElems; ++p) {
            const int64_t r = tr * kTile + pos_row[p];
            target[p] = static_cast<float>(wp[r * cols + j + pos_col[p]]);
            pos_scale[p] = scale[r * groups + g];
          }
          uint32_t* words =
              out.trellis.data() + ((t0 + tr) * tiles_per_row + j / kTile) * words_per_tile;
          trellis_encode_tile(target, pos_scale, k, words);
          int16_t codes[kTrellisTileElems];
          trellis_decode_tile(words, k, codes);
          for (int row = 0; row < kTile; ++row) {
            const int64_t r = tr * kTile + row;
            const float sc = scale[r * groups + g];
            double* wr = wp.data() + r * cols;
            for (int c = 0; c < kTile; ++c) {
              const float deq = sc * static_cast<float>(codes[row * kTile + c]);
              out.dequant[(r0 + r) * cols + j + c] = deq;
              diff[c] = wr[j + c] - deq;
            }
            double* e = err.data() + r * kLazyBlock + (j - i1);
            solve_upper_right(diff, ubb, cols, e);
            // The rest of this 128-column block now; beyond it once per block (below).
            for (int c = 0; c < kTile; ++c) {
              const double* uj = u.data() + int64_t{j + c} * cols;
              for (int kk = j + kTile; kk < i2; ++kk) wr[kk] -= e[c] * uj[kk];
            }
          }
        }
      }
      lazy_block_update(wp.data(), nr, cols, err.data(), kLazyBlock, i2 - i1, u, i1, i2, 1);
    }
    for (int64_t r = 0; r < nr; ++r)
      for (int g = 0; g < groups; ++g)
        out.scales[(r0 + r) * groups + g] = f32_to_f16(scale[r * groups + g]);
  });
  return out;
}

}  // namespace gyre::quant
