// Target correction for GPTQ's sequential pass (--target-correction).
//
// In the quantization pass each linear layer's input X_q [N, n] comes from the already-quantized
// layers before it, while the original model fed it X_f (the same tokens through the unquantized
// layers). What should be kept is the original output W X_f, not W X_q. With rows as tokens:
//
//   J(Q) = || X_f W^T - X_q Q^T ||_F^2
//        = tr(Q X_q^T X_q Q^T) - 2 tr(W X_f^T X_q Q^T) + const
//        = tr(Q H Q^T) - 2 tr(W C Q^T) + const,     H = X_q^T X_q,  C = X_f^T X_q.
//
// Completing the square with W* defined by W* H = W C (H symmetric):
//
//   J(Q) = tr((Q - W*) H (Q - W*)^T) + const,       W* = W C H^-1,
//
// which is GPTQ's objective with the Hessian of X_q and the target W* instead of W. With few
// calibration tokens W C H^-1 overfits (and H is near singular in rarely seen directions), so
// the fit is regularized toward the original weights, not toward zero:
//
//   J(Q) + lambda ||Q - W||_F^2 = tr(Q (H + lambda I) Q^T) - 2 tr(W (C + lambda I) Q^T) + const
//   =>  W* = W (C + lambda I) (H + lambda I)^-1 = W + W (C - H) (H + lambda I)^-1,
//
// so W* = W exactly when X_q = X_f at any lambda (plain ridge, W C (H + lambda I)^-1, would
// shrink W in the low-energy directions instead; measured worse at 6 bits). lambda = damp *
// mean diag H. Both matrices are kept at GPTQ's 2/N scale (hessian_of).
#pragma once
#include <cstdint>
#include <vector>

namespace gyre::quant {

// C = 2/N x_fp^T x_q [n x n] (row i: original input column i) for x_fp, x_q [tokens, n].
std::vector<double> cross_covariance(const std::vector<float>& x_fp, const std::vector<float>& x_q,
                                     int64_t tokens, int n, int threads);

struct DampedFactor {
  std::vector<double> l;  // lower Cholesky factor of H + lambda I
  double lambda = 0.0;
};
// lambda = damp * mean(diag H), raised tenfold until H + lambda I factors (a zero diagonal
// counts as 1, as in gptq_prepare). Throws gyre::Error when even lambda = mean diag H fails.
DampedFactor damped_factor(const std::vector<double>& h, int n, double damp);

// W* [rows, n] = W (C + lambda I) (H + lambda I)^-1 from w [rows, n], c = cross_covariance and
// f = damped_factor(H): per row, (H + lambda I) w*_r = C^T w_r + lambda w_r.
std::vector<float> corrected_target(const std::vector<float>& w, int n,
                                    const std::vector<double>& c, const DampedFactor& f,
                                    int threads);

}  // namespace gyre::quant
