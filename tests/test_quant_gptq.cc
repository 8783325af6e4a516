// GPTQ, RTN and the packed format of src/quant against independent references: a naive float64
// GPTQ written here the way the paper first states it (explicit inverse Hessian, column by
// column, rank-one downdates, no Cholesky, no lazy batches), RTN itself where GPTQ must reduce
// to it (H = I), and the loader's own dequantization (GGUF block formulas) for the round trip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "backend/cpu/qlinear_ref.h"
#include "core/half.h"
#include "model/gyre_quant_loader.h"
#include "model/safetensors.h"
#include "quant/block_forward.h"
#include "quant/convert_pass.h"
#include "quant/gptq.h"
#include "quant/measure.h"

namespace gyre::quant {
namespace {

std::vector<float> random_matrix(int rows, int cols, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> m(static_cast<size_t>(rows) * cols);
  for (float& x : m) x = d(rng);
  return m;
}

// Inputs with correlated features (x = z A) and uneven scales, as real activations are.
std::vector<double> correlated_hessian(int n, uint32_t seed, int tokens = 512) {
  const std::vector<float> a = random_matrix(n, n, seed);
  const std::vector<float> z = random_matrix(tokens, n, seed + 1);
  std::vector<float> x(static_cast<size_t>(tokens) * n, 0.0f);
  for (int t = 0; t < tokens; ++t)
    for (int i = 0; i < n; ++i) {
      double s = 0;
      for (int k = 0; k < n; ++k) s += z[t * n + k] * a[k * n + i] * (k < n / 4 ? 3.0 : 0.3);
      x[t * n + i] = static_cast<float>(s * (1.0 + (i % 7)));
    }
  return hessian_of(x, tokens, n, 1);
}

// The naive reference: OBQ-style GPTQ with the explicit inverse (Gauss-Jordan), same damping,
// visiting order and group rule (parameters at a group's first visit, from current values).
std::vector<int> naive_gptq(const std::vector<float>& w, int rows, int n, std::vector<double> h,
                            const QuantSetting& st, double damp, bool act_order) {
  std::vector<double> diag(n);
  double mean = 0;
  for (int i = 0; i < n; ++i) {
    diag[i] = h[i * n + i] == 0 ? 1.0 : h[i * n + i];
    mean += diag[i];
  }
  mean /= n;
  for (int i = 0; i < n; ++i) h[i * n + i] = diag[i] + damp * mean;
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  if (act_order)
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return diag[a] > diag[b]; });
  // Gauss-Jordan inverse in the original order.
  std::vector<double> a = h, inv(static_cast<size_t>(n) * n, 0.0);
  for (int i = 0; i < n; ++i) inv[i * n + i] = 1;
  for (int c = 0; c < n; ++c) {
    int p = c;
    for (int r = c; r < n; ++r)
      if (std::fabs(a[r * n + c]) > std::fabs(a[p * n + c])) p = r;
    for (int k = 0; k < n; ++k)
      std::swap(a[c * n + k], a[p * n + k]), std::swap(inv[c * n + k], inv[p * n + k]);
    const double d = a[c * n + c];
    for (int k = 0; k < n; ++k) a[c * n + k] /= d, inv[c * n + k] /= d;
    for (int r = 0; r < n; ++r)
      if (r != c) {
        const double f = a[r * n + c];
        for (int k = 0; k < n; ++k)
          a[r * n + k] -= f * a[c * n + k], inv[r * n + k] -= f * inv[c * n + k];
      }
  }
  std::vector<int> q(static_cast<size_t>(rows) * n);
  const int gs = st.group_size;
  for (int r = 0; r < rows; ++r) {
    std::vector<double> hi = inv, wr(n);
    for (int i = 0; i < n; ++i) wr[i] = w[r * n + i];
    std::vector<bool> done(n, false), chosen(n / gs, false);
    std::vector<float> s(n / gs), m(n / gs);
    for (int j = 0; j < n; ++j) {
      const int c = order[j], g = c / gs;
      if (!chosen[g]) {
        chosen[g] = true;
        std::vector<double> v(wr.begin() + g * gs, wr.begin() + (g + 1) * gs);
        choose_group_params(v.data(), gs, st, s[g], m[g]);
      }
      q[r * n + c] = quantize_value(wr[c], st, s[g], m[g]);
      const double e = (wr[c] - quant_dequant_value(st, q[r * n + c], s[g], m[g])) / hi[c * n + c];
      done[c] = true;
      for (int k = 0; k < n; ++k)
        if (!done[k]) wr[k] -= e * hi[c * n + k];
      // Remove column c from the inverse (the OBS downdate).
      std::vector<double> row(hi.begin() + c * n, hi.begin() + (c + 1) * n);
      const double d = row[c];
      for (int i = 0; i < n; ++i)
        for (int k = 0; k < n; ++k) hi[i * n + k] -= row[i] * row[k] / d;
    }
  }
  return q;
}

TEST(QuantGptq, MatchesNaiveFloat64Reference) {
  const int rows = 12, n = 96;
  for (bool act : {false, true})
    for (const QuantSetting& st :
         {QuantSetting{4, 32, true}, QuantSetting{3, 32, false}, QuantSetting{2, 32, true}}) {
      const std::vector<float> w = random_matrix(rows, n, 7);
      const std::vector<double> h = correlated_hessian(n, 11);
      const GptqPrep prep = gptq_prepare(h, n, 0.01, act);
      // A lazy block of 40 columns: blocks cut through groups, and several lazy updates happen.
      const QuantizedWeight q = gptq_quantize(w.data(), rows, n, prep, st, 2, 40);
      const std::vector<int> ref = naive_gptq(w, rows, n, h, st, 0.01, act);
      int diff = 0;
      for (size_t i = 0; i < ref.size(); ++i) diff += ref[i] != q.q[i];
      // Rounding-order differences may flip a value sitting on a rounding boundary, no more.
      EXPECT_LE(diff, 2) << st.str() << " act_order " << act;
    }
}

TEST(QuantGptq, IdentityHessianIsRoundToNearest) {
  const int rows = 8, n = 128;
  std::vector<double> h(static_cast<size_t>(n) * n, 0.0);
  for (int i = 0; i < n; ++i) h[i * n + i] = 1.0;
  const std::vector<float> w = random_matrix(rows, n, 3);
  for (const QuantSetting& st : {QuantSetting{4, 128, true}, QuantSetting{3, 32, false}}) {
    const QuantizedWeight g =
        gptq_quantize(w.data(), rows, n, gptq_prepare(h, n, 0.01, true), st, 1);
    const QuantizedWeight r = rtn_quantize(w.data(), rows, n, st);
    EXPECT_EQ(g.q, r.q);
    EXPECT_EQ(g.scales, r.scales);
    EXPECT_EQ(g.mins, r.mins);
  }
}

TEST(QuantGptq, BeatsRoundToNearestOnCorrelatedInputs) {
  const int rows = 32, n = 128;
  const std::vector<float> w = random_matrix(rows, n, 5);
  const std::vector<double> h = correlated_hessian(n, 9);
  const GptqPrep prep = gptq_prepare(h, n, 0.01, true);
  for (const QuantSetting& st :
       {QuantSetting{2, 64, false}, QuantSetting{3, 128, true}, QuantSetting{4, 32, true}}) {
    const double eg = relative_error(w.data(), gptq_quantize(w.data(), rows, n, prep, st, 2), h, 2);
    const double er = relative_error(w.data(), rtn_quantize(w.data(), rows, n, st), h, 2);
    EXPECT_LT(eg, er) << st.str();
  }
}

TEST(QuantGptq, RelativeErrorIsTheQuadraticForm) {
  const int rows = 3, n = 32;
  const std::vector<float> w = random_matrix(rows, n, 21);
  const std::vector<double> h = correlated_hessian(n, 22, 64);
  const QuantizedWeight q = rtn_quantize(w.data(), rows, n, {3, 32, true});
  double num = 0, den = 0;  // tr(E H E^T), tr(W H W^T) summed directly in float64
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < n; ++k) {
        const double ei = w[r * n + i] - q.dequant[r * n + i],
                     ek = w[r * n + k] - q.dequant[r * n + k];
        num += ei * h[i * n + k] * ek;
        den += w[r * n + i] * h[i * n + k] * w[r * n + k];
      }
  EXPECT_NEAR(relative_error(w.data(), q, h, 2), num / den, 1e-12 * (num / den) + 1e-15);
}

// Every bit width and group size: pack, write, load through the model loader (QPACKED at every
// width) and compare with the quantizer's own dequantized values bit for bit;
// the error of each value is within half a step.
TEST(QuantGptq, PackLoadRoundTripEveryWidth) {
  const std::string dir = ::testing::TempDir() + "/gyre_quant_roundtrip";
  std::filesystem::create_directories(dir);
  const int rows = 5, n = 128;
  const std::vector<float> w = random_matrix(rows, n, 13, 0.05f);
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int g : {32, 64, 128})
      for (bool sym : {true, false}) {
        const QuantSetting st{bits, g, sym};
        const QuantizedWeight q = rtn_quantize(w.data(), rows, n, st);
        for (size_t i = 0; i < w.size(); ++i) {
          const int64_t gi =
              static_cast<int64_t>(i / n) * (n / g) + static_cast<int64_t>(i % n) / g;
          const float s = f16_to_f32(q.scales[gi]);
          EXPECT_LE(std::fabs(w[i] - q.dequant[i]), 0.5f * s * 1.001f + 2e-4f) << st.str();
        }
        const std::string path = dir + "/t.safetensors";
        write_safetensors(path, pack_tensors(q, "x"));
        WeightSet raw, out;
        safetensors_load(path, raw);
        nlohmann::json cfg;
        nlohmann::json layer = {{"bits", bits}, {"group_size", g}, {"sym", sym}};
        layer["shape"] = {rows, n};
        cfg["quantization_config"]["quant_method"] = "gyre";
        cfg["quantization_config"]["version"] = 1;
        cfg["quantization_config"]["layers"]["x"] = layer;
        gyre_quant_load(cfg, raw, out, path);
        const TensorView& t = out.get("x.weight");
        ASSERT_EQ(t.dtype, DType::QPACKED) << st.str();
        const QWeightDesc& d = qweight_of_view(t).desc;
        EXPECT_EQ(d.bits, bits) << st.str();
        EXPECT_EQ(d.group_size, g) << st.str();  // the file's groups, not expanded to 32
        EXPECT_EQ(d.asymmetric, !sym) << st.str();
        EXPECT_DOUBLE_EQ(d.bits_per_weight(), st.bits_per_weight()) << st.str();
        const std::vector<float> back = tensor_to_f32(t);
        ASSERT_EQ(back.size(), q.dequant.size());
        for (size_t i = 0; i < back.size(); ++i)
          ASSERT_EQ(back[i], q.dequant[i]) << st.str() << " at " << i;
      }
}

}  // namespace
}  // namespace gyre::quant

namespace gyre::quant {
namespace {

// The clipping search against a naive float64 scan of the same grid: the chosen scale (and min)
// reach the least weighted rounding error among range factors 1, 0.98, ..., 0.70, which is never
// worse than the plain min/max parameters. Heavy-tailed groups make clipping pay off.
TEST(QuantGptq, ClipSearchFindsTheBestRangeFactor) {
  std::mt19937 rng(3);
  std::student_t_distribution<double> heavy(2.0);
  std::uniform_real_distribution<double> uni(0.1, 2.0);
  int improved = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const QuantSetting st{2 + trial % 3, 32, trial % 2 == 0};
    std::vector<double> v(32), h(32);
    for (int i = 0; i < 32; ++i) v[i] = heavy(rng), h[i] = uni(rng);
    auto err = [&](float s, float m) {
      double e = 0;
      for (int i = 0; i < 32; ++i) {
        const double q =
            st.sym ? std::clamp(std::nearbyint(v[i] / s) + st.offset(), 0.0, double(st.qmax()))
                   : std::clamp(std::nearbyint((v[i] - m) / s), 0.0, double(st.qmax()));
        const double d = v[i] - (st.sym ? s * (q - st.offset()) : s * q + m);
        e += h[i] * d * d;
      }
      return e;
    };
    double lo = 1e300, hi = -1e300, amax = 0;
    for (double x : v)
      lo = std::min(lo, x), hi = std::max(hi, x), amax = std::max(amax, std::abs(x));
    double best = 1e300;
    for (int k = 0; k <= 15; ++k) {
      const double a = 1.0 - 0.02 * k;
      const float s = f16_to_f32(
          f32_to_f16(float(st.sym ? a * amax / (st.offset() - 1) : a * (hi - lo) / st.qmax())));
      const float m = st.sym ? 0.0f : f16_to_f32(f32_to_f16(float(a * lo)));
      best = std::min(best, err(s, m));
    }
    float s0, m0, s1, m1;
    choose_group_params(v.data(), 32, st, s0, m0);
    choose_group_params_clipped(v.data(), h.data(), 32, st, s1, m1);
    EXPECT_NEAR(err(s1, m1), best, 1e-6 * best) << trial;
    EXPECT_LE(err(s1, m1), err(s0, m0)) << trial;
    improved += err(s1, m1) < err(s0, m0);
  }
  EXPECT_GT(improved, 100);
}

// rtn_exact against grids built here by the GGML block formulas (Q8_0: d = max|x| / 127, x = q d;
// Q4_1: d = (max - min) / 15, x = q d + min; d, min and the values in F16, as a GGUF tensor
// exported to F16 holds them): on the grid at its own width and block, and at a finer width
// (Q4_1 at 8 bits); off it at coarser groups, fewer bits, or for plain Gaussian weights.
TEST(QuantGptq, RtnExactFindsGgufGrids) {
  const int rows = 24, cols = 256;
  const std::vector<float> x = random_matrix(rows, cols, 77, 0.05f);
  std::vector<float> q8(x.size()), q41(x.size());
  auto f16 = [](double v) { return f16_to_f32(f32_to_f16(static_cast<float>(v))); };
  for (size_t b = 0; b < x.size(); b += 32) {
    double amax = 0.0, lo = INFINITY, hi = -INFINITY;
    for (size_t i = b; i < b + 32; ++i) {
      amax = std::max(amax, std::fabs(double{x[i]}));
      lo = std::min(lo, double{x[i]});
      hi = std::max(hi, double{x[i]});
    }
    const double d8 = f16(amax / 127), d4 = f16((hi - lo) / 15), m4 = f16(lo);
    for (size_t i = b; i < b + 32; ++i) {
      q8[i] = f16(std::nearbyint(x[i] / (amax / 127)) * d8);
      q41[i] = f16(std::clamp(std::nearbyint((x[i] - lo) / ((hi - lo) / 15)), 0.0, 15.0) * d4 + m4);
    }
  }
  auto st = [](int bits, int group, bool sym) {
    QuantSetting s;
    s.bits = bits;
    s.group_size = group;
    s.sym = sym;
    return s;
  };
  EXPECT_TRUE(rtn_exact(q8.data(), rows, cols, st(8, 32, true)));
  EXPECT_FALSE(rtn_exact(q8.data(), rows, cols, st(8, 64, true)));
  EXPECT_FALSE(rtn_exact(q8.data(), rows, cols, st(6, 32, true)));
  EXPECT_TRUE(rtn_exact(q41.data(), rows, cols, st(4, 32, false)));
  EXPECT_TRUE(rtn_exact(q41.data(), rows, cols, st(8, 32, false)));
  EXPECT_FALSE(rtn_exact(q41.data(), rows, cols, st(4, 64, false)));
  EXPECT_FALSE(rtn_exact(q41.data(), rows, cols, st(3, 32, false)));
  EXPECT_FALSE(rtn_exact(q41.data(), rows, cols, st(4, 32, true)));
  for (const int bits : {2, 4, 8})
    EXPECT_FALSE(rtn_exact(x.data(), rows, cols, st(bits, 32, true)));
  // One value moved off the grid by a third of a step is enough.
  q41[5 * cols + 70] += static_cast<float>(
      (*std::max_element(q41.begin() + 5 * cols + 64, q41.begin() + 5 * cols + 96) -
       *std::min_element(q41.begin() + 5 * cols + 64, q41.begin() + 5 * cols + 96)) /
      45);
  EXPECT_FALSE(rtn_exact(q41.data(), rows, cols, st(4, 32, false)));
}

}  // namespace
}  // namespace gyre::quant
