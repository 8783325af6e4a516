#include "quant/scale_refit.h"

#include <cmath>
#include <mutex>

#include "core/error.h"
#include "core/half.h"
#include "quant/linalg.h"

namespace gyre::quant {

namespace {

// The row's error e^T H e with e = w - deq.
double row_error(const float* w, const float* deq, const std::vector<double>& h, int n,
                 std::vector<double>& e) {
  for (int i = 0; i < n; ++i) e[i] = static_cast<double>(w[i]) - deq[i];
  double s = 0.0;
  for (int i = 0; i < n; ++i) {
    const double* hi = h.data() + int64_t{i} * n;
    double t = 0.0;
    for (int k = 0; k < n; ++k) t += hi[k] * e[k];
    s += e[i] * t;
  }
  return s;
}

}  // namespace

RefitResult refit_scales(const float* w, QuantizedWeight& q, const std::vector<double>& h,
                         bool diagonal, int threads) {
  const int n = q.cols, gs = q.setting.group_size, groups = n / gs;
  GYRE_CHECK(h.size() == static_cast<size_t>(n) * n, "internal: refit Hessian size mismatch");
  const bool sym = q.setting.sym;
  const int per = sym ? 1 : 2, np = groups * per;  // parameters per group, per row
  std::vector<QuantSetting> group_st(static_cast<size_t>(groups), q.setting.part(false));
  for (int g : q.hi_groups) group_st[g] = q.setting.part(true);
  RefitResult total;
  std::mutex mu;
  parallel_ranges(q.rows, threads, [&](int64_t r0, int64_t r1) {
    std::vector<double> a(static_cast<size_t>(n)), ha(static_cast<size_t>(n) * np),
        hw(static_cast<size_t>(n)), m(static_cast<size_t>(np) * np), rhs(static_cast<size_t>(np)),
        e(static_cast<size_t>(n));
    std::vector<float> deq(static_cast<size_t>(n)), sc(static_cast<size_t>(groups)),
        mn(static_cast<size_t>(groups));
    RefitResult part;
    for (int64_t r = r0; r < r1; ++r) {
      const float* wr = w + r * n;
      float* dr = q.dequant.data() + r * n;
      const int* qr = q.q.data() + r * n;
      // Basis: parameter p = g * per (scale) and g * per + 1 (min); a[i] the scale's coefficient.
      for (int i = 0; i < n; ++i) {
        const QuantSetting& st = group_st[i / gs];
        a[i] = sym ? qr[i] - st.offset() : qr[i];
      }
      auto basis = [&](int p, int i) {  // coefficient of parameter p at column i
        if (i / gs != p / per) return 0.0;
        return p % per == 0 ? a[i] : 1.0;
      };
      // ha[i][p] = (H A)[i][p]; the basis of p lives on one group's columns.
      for (int i = 0; i < n; ++i) {
        const double* hi = h.data() + int64_t{i} * n;
        if (diagonal) {
          hw[i] = hi[i] * wr[i];
          for (int p = 0; p < np; ++p) ha[int64_t{i} * np + p] = hi[i] * basis(p, i);
          continue;
        }
        double t = 0.0;
        for (int k = 0; k < n; ++k) t += hi[k] * wr[k];
        hw[i] = t;
        for (int p = 0; p < np; ++p) {
          const int g0 = (p / per) * gs;
          double s = 0.0;
          for (int k = g0; k < g0 + gs; ++k) s += hi[k] * basis(p, k);
          ha[int64_t{i} * np + p] = s;
        }
      }
      for (int p = 0; p < np; ++p) {
        const int g0 = (p / per) * gs;
        rhs[p] = 0.0;
        for (int i = g0; i < g0 + gs; ++i) rhs[p] += basis(p, i) * hw[i];
        for (int p2 = 0; p2 < np; ++p2) {
          double s = 0.0;
          for (int i = g0; i < g0 + gs; ++i) s += basis(p, i) * ha[int64_t{i} * np + p2];
          m[int64_t{p} * np + p2] = s;
        }
      }
      // A parameter whose basis is zero (a symmetric group of all-zero codes) or singular
      // stays at its stored value: its row and column are replaced by the identity.
      for (int p = 0; p < np; ++p) {
        if (m[int64_t{p} * np + p] > 0.0) continue;
        const int g = p / per;
        for (int p2 = 0; p2 < np; ++p2) {
          rhs[p2] -= m[int64_t{p2} * np + p] * (p % per == 0 ? f16_to_f32(q.scales[r * groups + g])
                                                             : f16_to_f32(q.mins[r * groups + g]));
          m[int64_t{p} * np + p2] = m[int64_t{p2} * np + p] = 0.0;
        }
        m[int64_t{p} * np + p] = 1.0;
        rhs[p] = p % per == 0 ? f16_to_f32(q.scales[r * groups + g])
                              : f16_to_f32(q.mins[r * groups + g]);
      }
      const double before = row_error(wr, dr, h, n, e);
      part.error_before += before;
      std::vector<double> l = m;
      bool ok = cholesky_lower(l, np);
      if (ok) {
        for (int i = 0; i < np; ++i) {  // L L^T p = rhs
          double s = rhs[i];
          for (int k = 0; k < i; ++k) s -= l[int64_t{i} * np + k] * rhs[k];
          rhs[i] = s / l[int64_t{i} * np + i];
        }
        for (int i = np - 1; i >= 0; --i) {
          double s = rhs[i];
          for (int k = i + 1; k < np; ++k) s -= l[int64_t{k} * np + i] * rhs[k];
          rhs[i] = s / l[int64_t{i} * np + i];
        }
        for (int g = 0; g < groups && ok; ++g) {
          sc[g] = f16_to_f32(f32_to_f16(static_cast<float>(rhs[g * per])));
          mn[g] = sym ? 0.0f : f16_to_f32(f32_to_f16(static_cast<float>(rhs[g * per + 1])));
          ok = std::isfinite(sc[g]) && std::isfinite(mn[g]);
        }
      }
      double after = before;
      if (ok) {
        for (int i = 0; i < n; ++i)
          deq[i] = quant_dequant_value(group_st[i / gs], qr[i], sc[i / gs], mn[i / gs]);
        after = row_error(wr, deq.data(), h, n, e);
      }
      if (ok && after < before) {
        for (int i = 0; i < n; ++i) dr[i] = deq[i];
        for (int g = 0; g < groups; ++g) {
          q.scales[r * groups + g] = f32_to_f16(sc[g]);
          if (!sym) q.mins[r * groups + g] = f32_to_f16(mn[g]);
        }
        part.error_after += after;
        ++part.rows_changed;
      } else {
        part.error_after += before;
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    total.error_before += part.error_before;
    total.error_after += part.error_after;
    total.rows_changed += part.rows_changed;
  });
  return total;
}

}  // namespace gyre::quant
