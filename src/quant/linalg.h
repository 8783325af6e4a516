// The heavy linear algebra of the quantizer, kept in a few functions so a GPU version can replace
// them: Hessian accumulation, the Cholesky factor of the inverse Hessian, GPTQ's lazy block
// update, and the quadratic-form trace of the error measure. All in float64, rows split over
// threads (each row of a weight is independent).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

namespace gyre::quant {

// Runs fn(r0, r1) over [0, n) split into up to `threads` contiguous ranges.
void parallel_ranges(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& fn);

// h[n x n] += x^T x for x [rows, n] (row-major floats); only the upper triangle is summed, then
// mirrored by symmetrize().
void hessian_add(std::vector<double>& h, const float* x, int64_t rows, int n, int threads);
void symmetrize_upper(std::vector<double>& h, int n);

// Lower Cholesky factor of a symmetric positive definite a [n x n] in place (upper part zeroed).
// Returns false when a is not positive definite.
bool cholesky_lower(std::vector<double>& a, int n);

// U upper triangular with inverse(a) = U^T U, for symmetric positive definite a. False when a is
// not positive definite.
bool inverse_cholesky_upper(const std::vector<double>& a, int n, std::vector<double>& u);

// GPTQ's lazy batch update: w[r, k] -= sum_j err[r, j] * u[j0 + j, k] for k in [k0, n), j in
// [0, nb), rows r in [0, rows) of w (stride n) and err (stride err_stride).
void lazy_block_update(double* w, int64_t rows, int n, const double* err, int err_stride, int nb,
                       const std::vector<double>& u, int j0, int k0, int threads);

// sum over rows r of m[r]^T h m[r] for m [rows, n] (floats) and symmetric h [n x n].
double quadratic_trace(const float* m, int64_t rows, int n, const std::vector<double>& h,
                       int threads);

}  // namespace gyre::quant
