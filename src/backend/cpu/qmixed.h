// A linear weight quantized at two or more bit widths (`gyre convert` mixes, model/gyre_qformat.h;
// EXL2 layers of several widths, model/exl2.h): the input columns are split into disjoint sets,
// each stored as its own packed weight in Gyre's layout (qlinear_ref.h) over just its columns, so
// the existing kernels run each part:
//   y = W x = sum over parts p of p.w (x[p.cols])
// where x[idx] gathers the listed input columns in order. A part may end in padding columns
// (index -1, reading 0: an EXL2 width whose last group is shorter than its group size is padded
// to whole groups). The CPU dequantizes every part into one float matrix (the reference); CUDA
// gathers x per part and adds the products.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu/qlinear_ref.h"
#include "core/tensor.h"

namespace gyre {

struct QMixedPart {
  QWeightHost w;              // [rows, cols.size()]
  std::vector<int32_t> cols;  // input column of each packed column, in order; -1: padding
};

// Parts a mixed weight may have: one per width EXL2 writes (8, 6, 5, 4, 3, 2).
constexpr int kQMixedMaxParts = 6;

struct QMixedHost {
  int rows = 0, cols = 0;
  // Gyre's own mixes: parts[0] the groups at the higher width ("hi"), parts[1] the rest.
  std::vector<QMixedPart> parts;
  // A rotated layer (backend/cpu/hadamard.h): the parts hold quant(W R), whose columns are
  // gathered from the rotated input R^T x; the parts themselves carry no rotation.
  HadamardRotation had;

  // Stored bits per weight over all rows * cols: every part's integers, scales and mins (padding
  // included), plus an I32 per group of every part but the last (as QuantSetting::stored_bits
  // counts the list of a mix's hi groups).
  double bits_per_weight() const;
};

// Throws unless there are 1..kQMixedMaxParts parts of `rows` rows with no permutation or rotation
// of their own, and their column lists (padding aside) are disjoint, in range, and together
// cover every column.
void qmixed_validate(const QMixedHost& m);

// Row r of W in the original column order (for a rotated weight, (W R)_q R^T).
void qmixed_dequantize_row(const QMixedHost& m, int64_t r, float* out);

// A TensorView for m (m must outlive it) of dtype QPACKED whose nbytes is sizeof(QMixedHost):
// code that knows only QWeightHost gets qweight_of_view's one-line error for it (never a silent
// misread), and code that knows mixes tells them apart with is_qmixed_view.
TensorView qmixed_view(const std::string& name, const QMixedHost& m);
bool is_qmixed_view(const TensorView& v);
const QMixedHost& qmixed_of_view(const TensorView& v);

// Whether a and b read the same columns into their parts with one layout per part, so their rows
// can be stacked (q|k|v of one unit share their groups' split: it comes from their shared input).
bool qmixed_same_layout(const QMixedHost& a, const QMixedHost& b);
// Row concatenation / interleaving in blocks (as qweight_concat_rows / qweight_interleave_rows)
// of weights with the same layout; throws otherwise.
QMixedHost qmixed_concat_rows(const std::vector<const QMixedHost*>& parts);
QMixedHost qmixed_interleave_rows(const QMixedHost& a, const QMixedHost& b, int block);

}  // namespace gyre
