// LDLQ with trellis-coded quantization (QTIP's "LDLQ": GPTQ with a vector quantizer) of one
// rotated linear weight W [rows, cols] (already W R, quant/unit_quant.h), the CPU reference of
// the agreed algorithm (docs/quantization.md, "Trellis"):
//   U = upper Cholesky factor of inverse(H) in the natural column order (gptq_prepare with
//   act_order false). For each 16-column block b = [j, j + 16): T = the current W[:, b]; Q = the
//   trellis code of T, one Viterbi (quant/trellis_encode.h) per 16-row tile with per-position
//   scales and unweighted squared error; E = (T - Q) inverse(U[b, b]); W[:, j + 16:] -= E U[b,
//   j + 16:] (within the current 128-column block at once, beyond it once per 128 columns).
// Unlike scalar GPTQ a block's 16 columns are coded jointly (the trellis is a vector quantizer
// over a tile), so the error feedback runs between blocks, not between columns: E solves
// E U[b, b] = T - Q, which is what column-by-column GPTQ would propagate had it picked Q.
// Scales: row r's group g gets, when its first block is reached, f16(rms(v) / kTrellisCodeRms *
// kTrellisScaleFit) over the group's current (updated) values v.
#pragma once
#include <cstdint>

#include "quant/gptq.h"

namespace gyre::quant {

// Scale fit on top of the RMS match, tuned once on unit Gaussians (plain trellis coding, group
// 128, per-row RMS; mean squared error per weight over 4k-12k values):
//   fit   K=2     K=3     K=4     K=5
//   0.95  0.0694  0.0183  0.0048  0.0013
//   1.00  0.0687  0.0177  0.0045  0.0012
//   1.05  0.0690  0.0174  0.0044  0.0012
//   1.10  0.0701  0.0177  0.0044  0.0011
// 1.05: 2-3% below 1.0 at K = 3, 4 (confirmed on a second draw of 12k values), within 0.5% of
// the best at K = 2 and 5. The GPU encoder must use the same constant.
inline constexpr double kTrellisScaleFit = 1.05;

// The f16 scale (as float) of a group whose current values are v[0..n).
float trellis_group_scale(const double* v, int n);

// The trellis setting at K bits for a rotated layer of cols columns (group = the rotation's block
// hadamard_block_for(cols)); trellis false when cols has no block.
QuantSetting trellis_setting(int bits, int64_t cols);

// LDLQ of w [rows, cols] (rows and cols multiples of 16) at st (st.trellis). prep must be in the
// natural column order (act_order false). Fills trellis (the tiles' words), scales and dequant
// (scale * code, in the space w is in); q stays empty. Tile rows are split over `threads`.
QuantizedWeight gptq_quantize_trellis(const float* w, int rows, int cols, const GptqPrep& prep,
                                      const QuantSetting& st, int threads);

}  // namespace gyre::quant
