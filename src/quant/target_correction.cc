#include "quant/target_correction.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "quant/linalg.h"

namespace gyre::quant {

std::vector<double> cross_covariance(const std::vector<float>& x_fp, const std::vector<float>& x_q,
                                     int64_t tokens, int n, int threads) {
  const size_t count = static_cast<size_t>(tokens) * n;
  GYRE_CHECK(tokens > 0 && x_fp.size() == count && x_q.size() == count,
             "internal: cross-covariance input size mismatch");
  std::vector<double> c(static_cast<size_t>(n) * n, 0.0);
  // Rows of C split over threads; tokens in tiles so a tile of x_q stays in cache.
  constexpr int64_t kTile = 64;
  parallel_ranges(n, threads, [&](int64_t i0, int64_t i1) {
    for (int64_t t0 = 0; t0 < tokens; t0 += kTile) {
      const int64_t t1 = std::min(tokens, t0 + kTile);
      for (int64_t i = i0; i < i1; ++i) {
        double* ci = c.data() + i * n;
        for (int64_t t = t0; t < t1; ++t) {
          const double a = x_fp[t * n + i];
          if (a == 0.0) continue;
          const float* xq = x_q.data() + t * n;
          for (int k = 0; k < n; ++k) ci[k] += a * xq[k];
        }
      }
    }
  });
  const double scale = 2.0 / static_cast<double>(tokens);
  for (double& v : c) v *= scale;
  return c;
}

DampedFactor damped_factor(const std::vector<double>& h, int n, double damp) {
  GYRE_CHECK(h.size() == static_cast<size_t>(n) * n, "internal: Hessian size mismatch");
  double mean = 0.0;
  for (int i = 0; i < n; ++i) mean += h[int64_t{i} * n + i] == 0.0 ? 1.0 : h[int64_t{i} * n + i];
  mean /= n;
  for (double d = std::max(damp, 1e-6);; d *= 10.0) {
    std::vector<double> l = h;
    for (int i = 0; i < n; ++i) {
      double& hii = l[int64_t{i} * n + i];
      hii = (hii == 0.0 ? 1.0 : hii) + d * mean;
    }
    if (cholesky_lower(l, n)) return {std::move(l), d * mean};
    GYRE_CHECK(d * 10.0 <= 1.0, "target correction: the Hessian does not factor even with damping ",
               d);
  }
}

std::vector<float> corrected_target(const std::vector<float>& w, int n,
                                    const std::vector<double>& c, const DampedFactor& f,
                                    int threads) {
  const std::vector<double>& l = f.l;
  GYRE_CHECK(n > 0 && w.size() % static_cast<size_t>(n) == 0 &&
                 c.size() == static_cast<size_t>(n) * n && l.size() == c.size(),
             "internal: target correction size mismatch");
  const int64_t rows = static_cast<int64_t>(w.size()) / n;
  std::vector<float> out(w.size());
  parallel_ranges(rows, threads, [&](int64_t r0, int64_t r1) {
    std::vector<double> y(static_cast<size_t>(n));
    for (int64_t r = r0; r < r1; ++r) {
      const float* wr = w.data() + r * n;
      // rhs = C^T w_r + lambda w_r: y[k] = sum_i C[i][k] w_r[i] + lambda w_r[k]
      for (int k = 0; k < n; ++k) y[k] = f.lambda * wr[k];
      for (int i = 0; i < n; ++i) {
        const double a = wr[i];
        if (a == 0.0) continue;
        const double* ci = c.data() + int64_t{i} * n;
        for (int k = 0; k < n; ++k) y[k] += a * ci[k];
      }
      // L L^T x = y: forward, then backward substitution.
      for (int i = 0; i < n; ++i) {
        const double* li = l.data() + int64_t{i} * n;
        double s = y[i];
        for (int k = 0; k < i; ++k) s -= li[k] * y[k];
        y[i] = s / li[i];
      }
      for (int i = n - 1; i >= 0; --i) {
        double s = y[i];
        for (int k = i + 1; k < n; ++k) s -= l[int64_t{k} * n + i] * y[k];
        y[i] = s / l[int64_t{i} * n + i];
      }
      for (int i = 0; i < n; ++i) out[r * n + i] = static_cast<float>(y[i]);
    }
  });
  return out;
}

}  // namespace gyre::quant
