#include "quant/linalg.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <thread>

namespace gyre::quant {

void parallel_ranges(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t t = std::clamp<int64_t>(threads, 1, std::max<int64_t>(1, n));
  if (t <= 1) {
    fn(0, n);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t i = 0; i < t; ++i) {
    const int64_t r0 = n * i / t, r1 = n * (i + 1) / t;
    pool.emplace_back([&fn, r0, r1] { fn(r0, r1); });
  }
  for (auto& th : pool) th.join();
}

void hessian_add(std::vector<double>& h, const float* x, int64_t rows, int n, int threads) {
  // Each thread owns a band of output rows i, so no two write the same element.
  parallel_ranges(n, threads, [&](int64_t i0, int64_t i1) {
    std::vector<double> xi(static_cast<size_t>(n));
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * n;
      for (int k = 0; k < n; ++k) xi[k] = xr[k];
      for (int64_t i = i0; i < i1; ++i) {
        const double a = xi[i];
        if (a == 0.0) continue;
        double* hi = h.data() + i * n;
        for (int64_t k = i; k < n; ++k) hi[k] += a * xi[k];
      }
    }
  });
}

void symmetrize_upper(std::vector<double>& h, int n) {
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < i; ++k) h[int64_t{i} * n + k] = h[int64_t{k} * n + i];
}

bool cholesky_lower(std::vector<double>& a, int n) {
  for (int j = 0; j < n; ++j) {
    double* aj = a.data() + int64_t{j} * n;
    double d = aj[j];
    for (int k = 0; k < j; ++k) d -= aj[k] * aj[k];
    if (!(d > 0.0) || !std::isfinite(d)) return false;
    const double l = std::sqrt(d);
    aj[j] = l;
    for (int i = j + 1; i < n; ++i) {
      double* ai = a.data() + int64_t{i} * n;
      double s = ai[j];
      for (int k = 0; k < j; ++k) s -= ai[k] * aj[k];
      ai[j] = s / l;
    }
    for (int k = j + 1; k < n; ++k) aj[k] = 0.0;
  }
  return true;
}

bool inverse_cholesky_upper(const std::vector<double>& a, int n, std::vector<double>& u) {
  std::vector<double> l = a;
  if (!cholesky_lower(l, n)) return false;
  // inv(L) by forward substitution, column by column (lower triangular).
  std::vector<double> li(static_cast<size_t>(n) * n, 0.0);
  for (int c = 0; c < n; ++c) {
    li[int64_t{c} * n + c] = 1.0 / l[int64_t{c} * n + c];
    for (int i = c + 1; i < n; ++i) {
      double s = 0.0;
      for (int k = c; k < i; ++k) s += l[int64_t{i} * n + k] * li[int64_t{k} * n + c];
      li[int64_t{i} * n + c] = -s / l[int64_t{i} * n + i];
    }
  }
  // inverse(a) = inv(L)^T inv(L); then its lower Cholesky factor, transposed, is U.
  std::vector<double> inv(static_cast<size_t>(n) * n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j <= i; ++j) {
      double s = 0.0;
      for (int k = i; k < n; ++k) s += li[int64_t{k} * n + i] * li[int64_t{k} * n + j];
      inv[int64_t{i} * n + j] = s;
      inv[int64_t{j} * n + i] = s;
    }
  if (!cholesky_lower(inv, n)) return false;
  u.assign(static_cast<size_t>(n) * n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j <= i; ++j) u[int64_t{j} * n + i] = inv[int64_t{i} * n + j];
  return true;
}

void lazy_block_update(double* w, int64_t rows, int n, const double* err, int err_stride, int nb,
                       const std::vector<double>& u, int j0, int k0, int threads) {
  if (k0 >= n) return;
  constexpr int64_t kRowChunk = 8;  // rows sharing each loaded row of u
  parallel_ranges(rows, threads, [&](int64_t r0, int64_t r1) {
    for (int64_t c0 = r0; c0 < r1; c0 += kRowChunk) {
      const int64_t c1 = std::min(r1, c0 + kRowChunk);
      for (int j = 0; j < nb; ++j) {
        const double* uj = u.data() + int64_t{j0 + j} * n;
        for (int64_t r = c0; r < c1; ++r) {
          const double e = err[r * err_stride + j];
          if (e == 0.0) continue;
          double* wr = w + r * n;
          for (int k = k0; k < n; ++k) wr[k] -= e * uj[k];
        }
      }
    }
  });
}

double quadratic_trace(const float* m, int64_t rows, int n, const std::vector<double>& h,
                       int threads) {
  double total = 0.0;
  std::mutex mu;
  parallel_ranges(rows, threads, [&](int64_t r0, int64_t r1) {
    std::vector<double> v(static_cast<size_t>(n)), hv(static_cast<size_t>(n));
    double sum = 0.0;
    for (int64_t r = r0; r < r1; ++r) {
      for (int k = 0; k < n; ++k) v[k] = m[r * n + k];
      // v^T h v with h symmetric: diagonal plus twice the strict upper triangle.
      for (int i = 0; i < n; ++i) {
        if (v[i] == 0.0) continue;
        const double* hi = h.data() + int64_t{i} * n;
        double s = 0.5 * hi[i] * v[i];
        for (int k = i + 1; k < n; ++k) s += hi[k] * v[k];
        sum += 2.0 * v[i] * s;
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    total += sum;
  });
  return total;
}

}  // namespace gyre::quant
