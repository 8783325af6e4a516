// Target correction (quant/target_correction.h) and scale refit (quant/scale_refit.h) against
// naive float64 references on small random layers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/half.h"
#include "core/mapped_file.h"
#include "engine/eval.h"
#include "engine/transformer.h"
#include "model/loader.h"
#include "quant/convert.h"
#include "quant/gptq.h"
#include "quant/measure.h"
#include "quant/scale_refit.h"
#include "quant/target_correction.h"

namespace gyre::quant {
namespace {

using Mat = std::vector<double>;  // row-major

std::vector<float> random_floats(size_t n, double sd, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> d(0.0, sd);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(d(rng));
  return v;
}

// Solves a x = b for each column of b [n, m] by Gaussian elimination with partial pivoting.
Mat naive_solve(Mat a, Mat b, int n, int m) {
  for (int c = 0; c < n; ++c) {
    int piv = c;
    for (int r = c + 1; r < n; ++r)
      if (std::fabs(a[r * n + c]) > std::fabs(a[piv * n + c])) piv = r;
    for (int k = 0; k < n; ++k) std::swap(a[c * n + k], a[piv * n + k]);
    for (int k = 0; k < m; ++k) std::swap(b[c * m + k], b[piv * m + k]);
    for (int r = 0; r < n; ++r) {
      if (r == c) continue;
      const double f = a[r * n + c] / a[c * n + c];
      for (int k = 0; k < n; ++k) a[r * n + k] -= f * a[c * n + k];
      for (int k = 0; k < m; ++k) b[r * m + k] -= f * b[c * m + k];
    }
  }
  for (int r = 0; r < n; ++r)
    for (int k = 0; k < m; ++k) b[r * m + k] /= a[r * n + r];
  return b;
}

// 2/N a^T b for a, b [tokens, n].
Mat naive_cross(const std::vector<float>& a, const std::vector<float>& b, int tokens, int n) {
  Mat c(static_cast<size_t>(n) * n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < n; ++k) {
      double s = 0;
      for (int t = 0; t < tokens; ++t) s += double{a[t * n + i]} * b[t * n + k];
      c[i * n + k] = 2.0 * s / tokens;
    }
  return c;
}

// sum_t || W x_fp,t - Q x_q,t ||^2
double output_error(const std::vector<float>& w, const std::vector<float>& q,
                    const std::vector<float>& xf, const std::vector<float>& xq, int rows, int n,
                    int tokens) {
  double e = 0;
  for (int t = 0; t < tokens; ++t)
    for (int r = 0; r < rows; ++r) {
      double a = 0, b = 0;
      for (int i = 0; i < n; ++i) {
        a += double{w[r * n + i]} * xf[t * n + i];
        b += double{q[r * n + i]} * xq[t * n + i];
      }
      e += (a - b) * (a - b);
    }
  return e;
}

TEST(LsqTargetCorrection, MatchesNaiveLeastSquares) {
  const int n = 24, rows = 5, tokens = 200;
  const std::vector<float> xf = random_floats(size_t{tokens} * n, 1.0, 1);
  std::vector<float> xq = random_floats(size_t{tokens} * n, 0.3, 2);
  for (size_t i = 0; i < xq.size(); ++i) xq[i] += xf[i];
  const std::vector<float> w = random_floats(size_t{rows} * n, 0.5, 3);
  const Mat c = cross_covariance(xf, xq, tokens, n, 2);
  const Mat c_ref = naive_cross(xf, xq, tokens, n);
  for (size_t i = 0; i < c.size(); ++i)
    ASSERT_NEAR(c[i], c_ref[i], 1e-9 * (1 + std::fabs(c_ref[i])));
  const Mat h = hessian_of(xq, tokens, n, 1);
  const double damp = 0.01;
  const std::vector<float> ws = corrected_target(w, n, c, damped_factor(h, n, damp), 2);
  // Reference: (H + lambda I) W*^T = (C + lambda I)^T W^T, lambda = damp * mean diag H.
  Mat hq = naive_cross(xq, xq, tokens, n);
  double mean = 0;
  for (int i = 0; i < n; ++i) mean += hq[i * n + i] / n;
  for (int i = 0; i < n; ++i) hq[i * n + i] += damp * mean;
  Mat rhs(static_cast<size_t>(n) * rows, 0.0);  // (C + lambda I)^T W^T [n, rows]
  for (int k = 0; k < n; ++k)
    for (int r = 0; r < rows; ++r) {
      rhs[k * rows + r] = damp * mean * w[r * n + k];
      for (int i = 0; i < n; ++i) rhs[k * rows + r] += c_ref[i * n + k] * w[r * n + i];
    }
  const Mat ref = naive_solve(hq, rhs, n, rows);
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < n; ++k)
      EXPECT_NEAR(ws[r * n + k], ref[k * rows + r], 1e-5 * (1 + std::fabs(ref[k * rows + r])));
}

TEST(LsqTargetCorrection, IdentityWhenInputsAgree) {
  const int n = 16, rows = 3, tokens = 100;
  const std::vector<float> x = random_floats(size_t{tokens} * n, 1.0, 4);
  const std::vector<float> w = random_floats(size_t{rows} * n, 1.0, 5);
  const Mat h = hessian_of(x, tokens, n, 1);
  // C = H: W* = W (H + lambda I)(H + lambda I)^-1 = W at any damping (regularized toward W).
  const std::vector<float> ws =
      corrected_target(w, n, cross_covariance(x, x, tokens, n, 1), damped_factor(h, n, 0.1), 1);
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(ws[i], w[i], 1e-4);
}

TEST(LsqTargetCorrection, LowersOutputErrorAgainstOriginal) {
  // The quantized inputs drift from the original ones by a fixed linear distortion plus noise
  // (what earlier quantized layers do); GPTQ toward W* must keep W x_fp better than GPTQ of W.
  const int n = 64, rows = 16, tokens = 512;
  const std::vector<float> xf = random_floats(size_t{tokens} * n, 1.0, 6);
  const std::vector<float> mix = random_floats(size_t{n} * n, 0.08, 7);
  const std::vector<float> noise = random_floats(size_t{tokens} * n, 0.1, 8);
  std::vector<float> xq(xf.size());
  for (int t = 0; t < tokens; ++t)
    for (int i = 0; i < n; ++i) {
      double s = xf[t * n + i] + noise[t * n + i];
      for (int k = 0; k < n; ++k) s += double{mix[i * n + k]} * xf[t * n + k];
      xq[t * n + i] = static_cast<float>(s);
    }
  const std::vector<float> w = random_floats(size_t{rows} * n, 0.5, 9);
  const Mat h = hessian_of(xq, tokens, n, 1);
  const GptqPrep prep = gptq_prepare(h, n, 0.01, true);
  const QuantSetting st{4, 32, true};
  const QuantizedWeight plain = gptq_quantize(w.data(), rows, n, prep, st, 1);
  const std::vector<float> ws =
      corrected_target(w, n, cross_covariance(xf, xq, tokens, n, 1), damped_factor(h, n, 0.01), 1);
  const QuantizedWeight corrected = gptq_quantize(ws.data(), rows, n, prep, st, 1);
  const double e_plain = output_error(w, plain.dequant, xf, xq, rows, n, tokens);
  const double e_corr = output_error(w, corrected.dequant, xf, xq, rows, n, tokens);
  EXPECT_LT(e_corr, 0.8 * e_plain);
}

// Refit reference: per row, the normal equations of w_hat = A p with the explicit A [n, P].
void check_refit(const QuantSetting& st, bool diagonal, uint32_t seed) {
  const int n = 64, rows = 12, tokens = 300;
  std::vector<float> x = random_floats(size_t{tokens} * n, 1.0, seed);
  for (int t = 0; t < tokens; ++t)  // correlated columns, so the full H differs from diag(H)
    for (int i = 1; i < n; ++i) x[t * n + i] += 0.5f * x[t * n + i - 1];
  const std::vector<float> w = random_floats(size_t{rows} * n, 0.5, seed + 1);
  const Mat h = hessian_of(x, tokens, n, 1);
  const GptqPrep prep = gptq_prepare(h, n, 0.01, true);
  const QuantizedWeight before = gptq_quantize(w.data(), rows, n, prep, st, 1);
  QuantizedWeight after = before;
  refit_scales(w.data(), after, h, diagonal, 2);
  const int gs = st.group_size, groups = n / gs, per = st.sym ? 1 : 2, np = groups * per;
  auto row_err = [&](const std::vector<float>& deq, int r) {
    double s = 0;
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < n; ++k)
        s += (double{w[r * n + i]} - deq[r * n + i]) * h[i * n + k] *
             (double{w[r * n + k]} - deq[r * n + k]);
    return s;
  };
  int changed = 0;
  for (int r = 0; r < rows; ++r) {
    Mat a(static_cast<size_t>(n) * np, 0.0);
    for (int i = 0; i < n; ++i) {
      const int g = i / gs, qv = before.q[r * n + i];
      a[i * np + g * per] = st.sym ? qv - st.offset() : qv;
      if (!st.sym) a[i * np + g * per + 1] = 1.0;
    }
    Mat m(static_cast<size_t>(np) * np, 0.0), rhs(static_cast<size_t>(np), 0.0);
    for (int p = 0; p < np; ++p)
      for (int i = 0; i < n; ++i)
        for (int k = 0; k < n; ++k) {
          const double hik = diagonal && i != k ? 0.0 : h[i * n + k];
          rhs[p] += a[i * np + p] * hik * w[r * n + k];
          for (int p2 = 0; p2 < np; ++p2) m[p * np + p2] += a[i * np + p] * hik * a[k * np + p2];
        }
    const Mat p = naive_solve(m, rhs, np, 1);
    const double e_before = row_err(before.dequant, r), e_after = row_err(after.dequant, r);
    EXPECT_LE(e_after, e_before * (1 + 1e-12)) << "row " << r;
    const bool row_changed =
        !std::equal(after.dequant.begin() + r * n, after.dequant.begin() + (r + 1) * n,
                    before.dequant.begin() + r * n);
    if (!row_changed) continue;
    ++changed;
    for (int g = 0; g < groups; ++g) {
      EXPECT_EQ(after.scales[r * groups + g], f32_to_f16(static_cast<float>(p[g * per])))
          << "row " << r << " group " << g;
      if (!st.sym) {
        EXPECT_EQ(after.mins[r * groups + g], f32_to_f16(static_cast<float>(p[g * per + 1])));
      }
    }
  }
  // The full refit is optimal for the checked error, so it helps most rows; the diagonal one
  // only where diag(H) ranks alike.
  EXPECT_GT(changed, diagonal ? 0 : rows / 2);
}

TEST(LsqScaleRefit, FullSymMatchesNormalEquations) {
  check_refit({4, 32, true}, false, 11);
}
TEST(LsqScaleRefit, FullAsymMatchesNormalEquations) {
  check_refit({3, 32, false}, false, 21);
}
TEST(LsqScaleRefit, DiagonalMatchesNormalEquations) {
  check_refit({4, 32, true}, true, 31);
}
TEST(LsqScaleRefit, DiagonalAsymMatchesNormalEquations) {
  check_refit({2, 32, false}, true, 41);
}

TEST(LsqHeadBits, FollowTheTarget) {
  ConvertOptions o;
  EXPECT_EQ(resolved_head_bits(o), 6);  // --bpw 4.0
  o.bpw = 6.0;
  EXPECT_EQ(resolved_head_bits(o), 8);
  o.uniform = "5:128";
  EXPECT_EQ(resolved_head_bits(o), 6);
  o.uniform = "8:64";
  EXPECT_EQ(resolved_head_bits(o), 8);
  o.head_bits = 0;
  EXPECT_EQ(resolved_head_bits(o), 0);
}

// End to end on stories260K (CPU): with target correction and the scale refit the output loads,
// records its options, and stays as close to the float model (the oracle) as plain GPTQ.
TEST(LsqConvert, Stories260KWithTargetCorrectionAndRefit) {
  const std::string model = std::string(GYRE_FIXTURES) + "/stories260K";
  auto f = load_model(model);
  auto backend = backend_create("cpu", 2);
  Transformer tf(f->config, f->weights, *backend, 128);
  EvalOptions eo;
  eo.ctx = 128;
  eo.score_all = true;
  eo.max_windows = 8;
  const std::string text =
      read_text_file(std::string(GYRE_FIXTURES) + "/text/tinystories-sample.txt").substr(0, 4000);
  const auto windows = make_eval_windows(*f->tokenizer, text, eo);
  auto kld_of = [&](bool correct, const std::string& refit) {
    ConvertOptions o;
    o.model = model;
    o.out = ::testing::TempDir() + "/gyre_lsq_" + (correct ? "tc_" : "plain_") + refit;
    std::filesystem::remove_all(o.out);
    o.rows = 8;
    o.length = 64;
    o.threads = 2;
    o.head_bits = 0;
    o.uniform = "4:32";
    o.progress = false;
    o.device = "cpu";
    o.target_correction = correct;
    o.scale_refit = refit;
    convert_model(o);
    const auto qc =
        nlohmann::json::parse(read_text_file(o.out + "/config.json"))["quantization_config"];
    EXPECT_EQ(qc["target_correction"].get<bool>(), correct);
    EXPECT_EQ(qc["scale_refit"].get<std::string>(), refit);
    auto q = load_model(o.out);
    Transformer tq(q->config, q->weights, *backend, 128);
    const KldResult r =
        evaluate_kld(windows, f->config.vocab_size, transformer_logits(tf), transformer_logits(tq));
    EXPECT_GT(r.top1_rate(), 0.7);
    return r.mean();
  };
  const double plain = kld_of(false, "off");
  const double corrected = kld_of(true, "off");
  const double refit = kld_of(true, "full");
  EXPECT_LT(corrected, 1.1 * plain) << "plain " << plain;
  EXPECT_LT(refit, 1.2 * plain) << "plain " << plain;
}

}  // namespace
}  // namespace gyre::quant
