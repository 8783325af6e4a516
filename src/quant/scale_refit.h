// Scale refit after GPTQ (--scale-refit): with the stored integers fixed, each row's group
// scales (and mins, asymmetric) are re-chosen to minimize that row's Hessian-weighted error
// (w - w_hat)^T H (w - w_hat), the quantity tr(E H E^T) sums over rows. w_hat is linear in the
// row's parameters p (w_hat = A p; column g of A holds the codes q - offset of group g, and for
// asymmetric settings a column of ones per group for its min), so the optimum solves the normal
// equations (A^T H A) p = A^T H w. GPTQ picks a group's scale before the error feedback has
// moved its later columns; the refit re-balances them once the codes are known.
//
// The refit parameters are rounded to f16 like stored ones, and a row keeps them only if its
// error went down, so the layer's tr(E H E^T) never rises. "Diagonal" uses only diag(H) (each
// group alone: a 1x1 or 2x2 system, O(cols) per row) where the full H (O(cols^2) per row) is
// too slow at large widths.
#pragma once
#include <vector>

#include "quant/gptq.h"

namespace gyre::quant {

struct RefitResult {
  double error_before = 0.0;  // tr(E H E^T) of the layer, unnormalized
  double error_after = 0.0;
  int rows_changed = 0;
};

// w [q.rows, q.cols] the target GPTQ quantized toward; h [cols x cols] its (undamped) Hessian.
// Updates q.scales, q.mins and q.dequant in place.
RefitResult refit_scales(const float* w, QuantizedWeight& q, const std::vector<double>& h,
                         bool diagonal, int threads);

}  // namespace gyre::quant
