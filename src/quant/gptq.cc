#include "quant/gptq.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/half.h"
#include "quant/linalg.h"

namespace gyre::quant {

namespace {

float round_f16(double x) {
  return f16_to_f32(f32_to_f16(static_cast<float>(x)));
}

QuantizedWeight allocate(int rows, int cols, const QuantSetting& st) {
  quant_setting_validate(st, cols, "quantize");
  QuantizedWeight out;
  out.setting = st;
  out.rows = rows;
  out.cols = cols;
  const size_t n = static_cast<size_t>(rows) * cols;
  out.q.assign(n, 0);
  out.dequant.assign(n, 0.0f);
  out.scales.assign(static_cast<size_t>(rows) * (cols / st.group_size), 0);
  if (!st.sym) out.mins.assign(out.scales.size(), 0);
  return out;
}

}  // namespace

void choose_group_params(const double* v, int n, const QuantSetting& st, float& s, float& m) {
  double lo = INFINITY, hi = -INFINITY, amax = 0.0;
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, v[i]);
    hi = std::max(hi, v[i]);
    amax = std::max(amax, std::fabs(v[i]));
  }
  if (st.sym) {
    s = round_f16(amax / (st.offset() - 1));
    m = 0.0f;
  } else {
    s = round_f16((hi - lo) / st.qmax());
    m = round_f16(lo);
  }
  GYRE_CHECK(std::isfinite(s) && std::isfinite(m), "quantize: a group's scale overflows f16");
}

void choose_group_params_clipped(const double* v, const double* h, int n, const QuantSetting& st,
                                 float& s, float& m) {
  choose_group_params(v, n, st, s, m);
  auto cost = [&](float sc, float mn) {
    double e = 0;
    for (int i = 0; i < n; ++i) {
      const double d = v[i] - quant_dequant_value(st, quantize_value(v[i], st, sc, mn), sc, mn);
      e += h[i] * d * d;
    }
    return e;
  };
  double best = cost(s, m);
  double lo = INFINITY, hi = -INFINITY, amax = 0.0;
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, v[i]);
    hi = std::max(hi, v[i]);
    amax = std::max(amax, std::fabs(v[i]));
  }
  for (int k = 1; k <= 15; ++k) {
    const double a = 1.0 - 0.02 * k;
    float sc, mn;
    if (st.sym) {
      sc = round_f16(a * amax / (st.offset() - 1));
      mn = 0.0f;
    } else {
      sc = round_f16(a * (hi - lo) / st.qmax());
      mn = round_f16(a * lo);
    }
    if (!std::isfinite(sc) || !std::isfinite(mn)) continue;
    const double c = cost(sc, mn);
    if (c < best) best = c, s = sc, m = mn;
  }
}

int quantize_value(double w, const QuantSetting& st, float s, float m) {
  if (s == 0.0f) return st.sym ? st.offset() : 0;
  const double q = st.sym ? std::nearbyint(w / s) + st.offset() : std::nearbyint((w - m) / s);
  return static_cast<int>(std::clamp(q, 0.0, static_cast<double>(st.qmax())));
}

QuantizedWeight rtn_quantize(const float* w, int rows, int cols, const QuantSetting& st) {
  GYRE_CHECK(!st.mixed(), "round to nearest has no mixes of two widths (GPTQ does)");
  QuantizedWeight out = allocate(rows, cols, st);
  const int gs = st.group_size, groups = cols / gs;
  std::vector<double> v(static_cast<size_t>(gs));
  for (int64_t r = 0; r < rows; ++r)
    for (int g = 0; g < groups; ++g) {
      for (int i = 0; i < gs; ++i) v[i] = w[r * cols + g * gs + i];
      float s, m;
      choose_group_params(v.data(), gs, st, s, m);
      out.scales[r * groups + g] = f32_to_f16(s);
      if (!st.sym) out.mins[r * groups + g] = f32_to_f16(m);
      for (int i = 0; i < gs; ++i) {
        const int64_t idx = r * cols + g * gs + i;
        out.q[idx] = quantize_value(v[i], st, s, m);
        out.dequant[idx] = quant_dequant_value(st, out.q[idx], s, m);
      }
    }
  return out;
}

bool rtn_exact(const float* w, int64_t rows, int64_t cols, const QuantSetting& st) {
  if (st.mixed() || st.trellis || cols % st.group_size != 0) return false;
  const int gs = st.group_size;
  std::vector<double> v(static_cast<size_t>(gs));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c0 = 0; c0 < cols; c0 += gs) {
      double amax = 0.0;
      for (int i = 0; i < gs; ++i) {
        v[i] = w[r * cols + c0 + i];
        amax = std::max(amax, std::fabs(v[i]));
      }
      float s, m;
      choose_group_params(v.data(), gs, st, s, m);
      for (int i = 0; i < gs; ++i)
        if (std::fabs(quant_dequant_value(st, quantize_value(v[i], st, s, m), s, m) - v[i]) >
            amax * 0x1p-9)
          return false;
    }
  return true;
}

GptqPrep gptq_prepare(const std::vector<double>& h_in, int cols, double damp, bool act_order) {
  GYRE_CHECK(h_in.size() == static_cast<size_t>(cols) * cols, "gptq: Hessian size mismatch");
  GYRE_CHECK(damp >= 0.0 && damp <= 1.0, "gptq: damping must be in [0, 1], got ", damp);
  GptqPrep p;
  p.cols = cols;
  std::vector<double> diag(static_cast<size_t>(cols));
  p.dead.assign(static_cast<size_t>(cols), false);
  double mean = 0.0;
  for (int i = 0; i < cols; ++i) {
    diag[i] = h_in[int64_t{i} * cols + i];
    GYRE_CHECK(std::isfinite(diag[i]), "gptq: the Hessian is not finite (inputs overflow)");
    if (diag[i] == 0.0) {
      p.dead[i] = true;
      diag[i] = 1.0;
    }
    mean += diag[i];
  }
  mean /= cols;
  p.hdiag = diag;
  p.order.resize(static_cast<size_t>(cols));
  std::iota(p.order.begin(), p.order.end(), 0);
  if (act_order)
    std::stable_sort(p.order.begin(), p.order.end(),
                     [&](int a, int b) { return diag[a] > diag[b]; });
  std::vector<double> hp(static_cast<size_t>(cols) * cols);
  for (double d = std::max(damp, 1e-6);; d *= 10.0) {
    for (int i = 0; i < cols; ++i)
      for (int k = 0; k < cols; ++k) {
        const int a = p.order[i], b = p.order[k];
        hp[int64_t{i} * cols + k] = a == b ? diag[a] + d * mean : h_in[int64_t{a} * cols + b];
      }
    if (inverse_cholesky_upper(hp, cols, p.u)) {
      p.damp_used = d;
      return p;
    }
    GYRE_CHECK(d * 10.0 <= 1.0, "gptq: the Hessian is not positive definite even with damping ", d);
  }
}

QuantizedWeight gptq_quantize(const float* w, int rows, int cols, const GptqPrep& prep,
                              const QuantSetting& st, int threads, int block) {
  GYRE_CHECK(prep.cols == cols, "gptq: prepared for ", prep.cols, " columns, weight has ", cols);
  QuantizedWeight out = allocate(rows, cols, st);
  const int gs = st.group_size, groups = cols / gs;
  // Each group's own width: the mix's chosen groups at mix_bits, the rest (all, unmixed) at bits.
  out.hi_groups = mix_hi_groups(st, prep.hdiag.data(), cols);
  std::vector<QuantSetting> group_st(static_cast<size_t>(groups), st.part(false));
  for (int g : out.hi_groups) group_st[g] = st.part(true);
  std::vector<int> pos(static_cast<size_t>(cols));
  for (int j = 0; j < cols; ++j) pos[prep.order[j]] = j;
  const std::vector<double>& u = prep.u;
  parallel_ranges(rows, threads, [&](int64_t r0, int64_t r1) {
    const int64_t nr = r1 - r0;
    // This range's rows in visiting order, and the scaled errors of the current block.
    std::vector<double> wp(static_cast<size_t>(nr) * cols), err(static_cast<size_t>(nr) * block);
    for (int64_t r = 0; r < nr; ++r)
      for (int j = 0; j < cols; ++j)
        wp[r * cols + j] = prep.dead[prep.order[j]] ? 0.0 : w[(r0 + r) * cols + prep.order[j]];
    std::vector<float> s(static_cast<size_t>(nr) * groups), m(s.size());
    std::vector<bool> chosen(static_cast<size_t>(groups), false);
    std::vector<double> v(static_cast<size_t>(gs));
    for (int i1 = 0; i1 < cols; i1 += block) {
      const int i2 = std::min(cols, i1 + block), nb = i2 - i1;
      for (int j = i1; j < i2; ++j) {
        const int col = prep.order[j], g = col / gs;
        if (!chosen[g]) {  // first visit of this group: parameters from its current values
          chosen[g] = true;
          for (int64_t r = 0; r < nr; ++r) {
            for (int i = 0; i < gs; ++i) {
              const int p = pos[g * gs + i];
              double x = wp[r * cols + p];
              if (p >= i2)  // not yet given this block's pending updates
                for (int jj = i1; jj < j; ++jj)
                  x -= err[r * block + jj - i1] * u[int64_t{jj} * cols + p];
              v[i] = x;
            }
            if (prep.clip_search)
              choose_group_params_clipped(v.data(), prep.hdiag.data() + g * gs, gs, group_st[g],
                                          s[r * groups + g], m[r * groups + g]);
            else
              choose_group_params(v.data(), gs, group_st[g], s[r * groups + g], m[r * groups + g]);
          }
        }
        const double d = u[int64_t{j} * cols + j];
        const double* uj = u.data() + int64_t{j} * cols;
        for (int64_t r = 0; r < nr; ++r) {
          double* wr = wp.data() + r * cols;
          const float sc = s[r * groups + g], mn = m[r * groups + g];
          const int q = quantize_value(wr[j], group_st[g], sc, mn);
          const float deq = quant_dequant_value(group_st[g], q, sc, mn);
          const double e = (wr[j] - deq) / d;
          err[r * block + j - i1] = e;
          for (int k = j + 1; k < i2; ++k) wr[k] -= e * uj[k];
          out.q[(r0 + r) * cols + col] = q;
          out.dequant[(r0 + r) * cols + col] = deq;
        }
      }
      lazy_block_update(wp.data(), nr, cols, err.data(), block, nb, u, i1, i2, 1);
    }
    for (int64_t r = 0; r < nr; ++r)
      for (int g = 0; g < groups; ++g) {
        out.scales[(r0 + r) * groups + g] = f32_to_f16(s[r * groups + g]);
        if (!st.sym) out.mins[(r0 + r) * groups + g] = f32_to_f16(m[r * groups + g]);
      }
  });
  return out;
}

double relative_error(const float* w, const QuantizedWeight& q, const std::vector<double>& h,
                      int threads) {
  const int64_t n = int64_t{q.rows} * q.cols;
  std::vector<float> e(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) e[i] = w[i] - q.dequant[i];
  const double den = quadratic_trace(w, q.rows, q.cols, h, threads);
  if (!(den > 0.0)) return 0.0;
  return quadratic_trace(e.data(), q.rows, q.cols, h, threads) / den;
}

}  // namespace gyre::quant
