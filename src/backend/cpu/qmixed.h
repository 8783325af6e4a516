// A linear weight quantized at two bit widths (`gyre convert` mixes, model/gyre_qformat.h): the
// input columns are split into two disjoint sets, each stored as its own packed weight in Gyre's
// layout (qlinear_ref.h) over just its columns, so the existing kernels run each part:
//   y = W x = hi (x[hi_cols]) + lo (x[lo_cols])
// where x[idx] gathers the listed input columns in order. The CPU dequantizes both parts into
// one float matrix (the reference); CUDA gathers x per part and adds the two products.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu/qlinear_ref.h"
#include "core/tensor.h"

namespace gyre {

struct QMixedHost {
  int rows = 0, cols = 0;
  QWeightHost hi, lo;                     // [rows, hi_cols.size()] and [rows, lo_cols.size()]
  std::vector<int32_t> hi_cols, lo_cols;  // input columns of each part's packed columns, in order
  // A rotated layer (backend/cpu/hadamard.h): the parts hold quant(W R), whose columns are
  // gathered from the rotated input R^T x; the parts themselves carry no rotation.
  HadamardRotation had;

  // Stored bits per weight over all rows * cols: both parts' integers, scales and mins, plus the
  // I32 list of the hi part's groups (as QuantSetting::stored_bits counts them).
  double bits_per_weight() const;
};

// Throws unless the parts have rows rows and no permutation of their own, and hi_cols / lo_cols
// are disjoint, in range, and together cover every column.
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
