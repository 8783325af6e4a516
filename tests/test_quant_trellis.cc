// The trellis converter's LDLQ (quant/gptq_trellis.h): its result decoded from its words with the
// tests' own bit reader and codebook (trellis_own_decode.h), its error feedback replayed by a
// float64 block-LDLQ written here (own inverse and Cholesky of H) with the result's codes fixed,
// its error against scalar GPTQ at the same bits, the settings' bookkeeping and UnitQuantizer's
// refusals. The conversion itself: test_quant_trellis_convert.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/trellis.h"
#include "core/error.h"
#include "core/half.h"
#include "error_test_util.h"
#include "quant/gptq.h"
#include "quant/gptq_trellis.h"
#include "quant/hadamard.h"
#include "quant/measure.h"
#include "quant/trellis_encode.h"
#include "quant/unit_quant.h"
#include "trellis_own_decode.h"

namespace gyre::quant {
namespace {

using namespace trellis_test;

// --- float64 linear algebra of the oracle ---

// H = 2/N X^T X of x [n, cols] Gaussian with correlated columns (each a mix of its neighbours).
std::vector<double> random_hessian(int cols, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> g;
  std::vector<double> x(size_t(n) * cols), h(size_t(cols) * cols, 0.0);
  for (int i = 0; i < n; ++i) {
    double prev = 0;
    for (int c = 0; c < cols; ++c) {
      prev = 0.6 * prev + g(rng) * (1.0 + 0.5 * (c % 5));
      x[size_t(i) * cols + c] = prev;
    }
  }
  for (int i = 0; i < n; ++i)
    for (int a = 0; a < cols; ++a)
      for (int b = 0; b < cols; ++b)
        h[size_t(a) * cols + b] += 2.0 / n * x[size_t(i) * cols + a] * x[size_t(i) * cols + b];
  return h;
}

// Upper U with inverse(H + damp * mean(diag H) I) = U^T U: Gauss-Jordan inverse, then the lower
// Cholesky factor L of it (U = L^T).
std::vector<double> own_upper_factor(const std::vector<double>& h, int n, double damp) {
  double mean = 0;
  for (int i = 0; i < n; ++i) mean += h[size_t(i) * n + i] / n;
  std::vector<double> a(h), inv(size_t(n) * n, 0.0);
  for (int i = 0; i < n; ++i) {
    a[size_t(i) * n + i] += damp * mean;
    inv[size_t(i) * n + i] = 1.0;
  }
  for (int c = 0; c < n; ++c) {  // SPD: no pivoting needed
    const double p = a[size_t(c) * n + c];
    for (int j = 0; j < n; ++j) a[size_t(c) * n + j] /= p, inv[size_t(c) * n + j] /= p;
    for (int r = 0; r < n; ++r) {
      if (r == c) continue;
      const double f = a[size_t(r) * n + c];
      for (int j = 0; j < n; ++j) {
        a[size_t(r) * n + j] -= f * a[size_t(c) * n + j];
        inv[size_t(r) * n + j] -= f * inv[size_t(c) * n + j];
      }
    }
  }
  std::vector<double> l(size_t(n) * n, 0.0);
  for (int j = 0; j < n; ++j)
    for (int i = j; i < n; ++i) {
      double s = inv[size_t(i) * n + j];
      for (int k = 0; k < j; ++k) s -= l[size_t(i) * n + k] * l[size_t(j) * n + k];
      l[size_t(i) * n + j] = i == j ? std::sqrt(s) : s / l[size_t(j) * n + j];
    }
  std::vector<double> u(size_t(n) * n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = i; j < n; ++j) u[size_t(i) * n + j] = l[size_t(j) * n + i];
  return u;
}

// tr(E H E^T) / tr(W H W^T), E = W - Q.
double own_relative_error(const std::vector<float>& w, const std::vector<float>& q,
                          const std::vector<double>& h, int rows, int cols) {
  double num = 0, den = 0;
  for (int r = 0; r < rows; ++r)
    for (int a = 0; a < cols; ++a)
      for (int b = 0; b < cols; ++b) {
        const double ha = h[size_t(a) * cols + b];
        const size_t ia = size_t(r) * cols + a, ib = size_t(r) * cols + b;
        num += (w[ia] - q[ia]) * ha * (w[ib] - q[ib]);
        den += double(w[ia]) * ha * w[ib];
      }
  return num / den;
}

std::vector<float> gaussian(size_t n, uint32_t seed, double sd = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, static_cast<float>(sd));
  std::vector<float> v(n);
  for (float& x : v) x = g(rng);
  return v;
}

QuantSetting trellis_st(int k, int group) {
  QuantSetting st{k, group, true};
  st.trellis = true;
  return st;
}

TEST(QuantTrellis, DequantIsScaleTimesTheWordsOwnCodes) {
  const int rows = 32, cols = 64;
  const std::vector<double> h = random_hessian(cols, 256, 1);
  const GptqPrep prep = gptq_prepare(h, cols, 0.01, /*act_order=*/false);
  const std::vector<float> w = gaussian(size_t(rows) * cols, 2, 0.05);
  for (const QuantSetting st : {trellis_st(3, 32), trellis_st(4, 64)}) {
    const QuantizedWeight q = gptq_quantize_trellis(w.data(), rows, cols, prep, st, 2);
    ASSERT_EQ(q.trellis.size(), size_t(rows / 16) * (cols / 16) * 8 * st.bits);
    ASSERT_EQ(q.scales.size(), size_t(rows) * (cols / st.group_size));
    EXPECT_TRUE(q.q.empty());
    const std::vector<int> codes = own_codes(q.trellis, rows, cols, st.bits);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        const float s =
            f16_to_f32(q.scales[size_t(r) * (cols / st.group_size) + c / st.group_size]);
        ASSERT_EQ(q.dequant[size_t(r) * cols + c], s * static_cast<float>(codes[r * cols + c]))
            << st.str() << " at " << r << ", " << c;
      }
  }
}

// The float64 block-LDLQ replayed with the result's own Q: every block's target T (what the
// encoder must have seen) and every group's scale (from T at its first block) are recomputed
// here; re-encoding each tile of T must give back the result's tile (its error equal to the
// encoder's optimum for that T), which fails if the library propagated anything else.
void expect_block_ldlq_feedback(int rows, int cols, int k, int group, uint32_t seed) {
  SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols) + ", K " + std::to_string(k));
  const std::vector<double> h = random_hessian(cols, 256, seed);
  const GptqPrep prep = gptq_prepare(h, cols, 0.01, false);
  const std::vector<double> u = own_upper_factor(h, cols, 0.01);
  for (size_t i = 0; i < u.size(); ++i) ASSERT_NEAR(prep.u[i], u[i], 1e-9 * (1 + std::fabs(u[i])));
  const std::vector<float> w = gaussian(size_t(rows) * cols, seed + 1, 0.05);
  const QuantSetting st = trellis_st(k, group);
  const QuantizedWeight q = gptq_quantize_trellis(w.data(), rows, cols, prep, st, 2);
  std::vector<double> cur(w.begin(), w.end());
  int same_tiles = 0, tiles = 0;
  for (int j = 0; j < cols; j += 16) {
    if (j % group == 0)
      for (int r = 0; r < rows; ++r) {
        double ss = 0;
        for (int c = j; c < j + group; ++c)
          ss += cur[size_t(r) * cols + c] * cur[size_t(r) * cols + c];
        const double want = std::sqrt(ss / group) / 148.0336 * kTrellisScaleFit;
        const double got = f16_to_f32(q.scales[size_t(r) * (cols / group) + j / group]);
        EXPECT_NEAR(got, want, 1.5e-3 * want) << "scale of row " << r << " group " << j / group;
      }
    for (int tr = 0; tr < rows / 16; ++tr) {  // re-encode T's tile with the result's scales
      float t[256], sc[256];
      double result_err = 0;
      for (int p = 0; p < 256; ++p) {
        int r = 0, c = 0;
        own_position(p, r, c);
        const size_t i = size_t(tr * 16 + r) * cols + j + c;
        t[p] = static_cast<float>(cur[i]);
        sc[p] = f16_to_f32(q.scales[size_t(tr * 16 + r) * (cols / group) + j / group]);
        result_err += (double(t[p]) - q.dequant[i]) * (double(t[p]) - q.dequant[i]);
      }
      std::vector<uint32_t> words(size_t(8 * k));
      const double best = trellis_encode_tile(t, sc, k, words.data());
      EXPECT_NEAR(result_err, best, 1e-4 * best) << "tile " << tr << ", block " << j / 16;
      const size_t at = (size_t(tr) * (cols / 16) + j / 16) * 8 * k;
      same_tiles += std::equal(words.begin(), words.end(), q.trellis.begin() + at);
      ++tiles;
    }
    // E = (T - Q) inverse(U_bb), then the later columns: W[:, j+16:] -= E U[b, j+16:].
    for (int r = 0; r < rows; ++r) {
      double e[16];
      for (int c = 0; c < 16; ++c) {
        double d = cur[size_t(r) * cols + j + c] - q.dequant[size_t(r) * cols + j + c];
        for (int i = 0; i < c; ++i) d -= e[i] * u[size_t(j + i) * cols + j + c];
        e[c] = d / u[size_t(j + c) * cols + j + c];
      }
      for (int c = 0; c < 16; ++c)
        for (int kk = j + 16; kk < cols; ++kk)
          cur[size_t(r) * cols + kk] -= e[c] * u[size_t(j + c) * cols + kk];
    }
  }
  // Float noise between the lazy and the eager updates may break an exact tie; never many.
  EXPECT_GE(same_tiles, tiles - 1);
}

TEST(QuantTrellis, ErrorFeedbackMatchesAFloat64BlockLdlq) {
  expect_block_ldlq_feedback(32, 64, 3, 32, 3);
  // Past 128 columns: the lazy updates between 128-column blocks too.
  expect_block_ldlq_feedback(16, 160, 2, 32, 11);
}

// On rotated Gaussian weights with a correlated input, trellis LDLQ beats scalar GPTQ (act-order,
// clipping search) at the same stored bits: K + 16 / 128 per weight both.
TEST(QuantTrellis, BeatsScalarGptqAtTheSameBits) {
  const int rows = 32, cols = 128;
  const HadamardRotation rot = unit_rotation("test.unit", cols);
  ASSERT_EQ(rot.block, 128);
  std::vector<double> h = random_hessian(cols, 512, 5);
  // R^T H R: rotate H's rows and columns (float64 through floats is enough for an error ratio).
  std::vector<float> hf(h.begin(), h.end());
  hadamard_rotate_rows(hf.data(), cols, cols, rot);
  for (int a = 0; a < cols; ++a)
    for (int b = 0; b < a; ++b) std::swap(hf[size_t(a) * cols + b], hf[size_t(b) * cols + a]);
  hadamard_rotate_rows(hf.data(), cols, cols, rot);
  h.assign(hf.begin(), hf.end());
  for (int a = 0; a < cols; ++a)
    for (int b = 0; b < a; ++b)
      h[size_t(a) * cols + b] = h[size_t(b) * cols + a] =
          0.5 * (h[size_t(a) * cols + b] + h[size_t(b) * cols + a]);
  std::vector<float> w = gaussian(size_t(rows) * cols, 6, 0.03);
  hadamard_rotate_rows(w.data(), rows, cols, rot);
  GptqPrep scalar_prep = gptq_prepare(h, cols, 0.01, true);
  scalar_prep.clip_search = true;
  const GptqPrep natural = gptq_prepare(h, cols, 0.01, false);
  for (int k : {2, 4}) {
    const QuantizedWeight s = gptq_quantize(w.data(), rows, cols, scalar_prep, {k, 128, true}, 2);
    const QuantizedWeight t =
        gptq_quantize_trellis(w.data(), rows, cols, natural, trellis_st(k, 128), 2);
    const QuantSetting scalar{k, 128, true};
    EXPECT_DOUBLE_EQ(trellis_st(k, 128).bits_per_weight(), scalar.bits_per_weight());
    const double es = own_relative_error(w, s.dequant, h, rows, cols);
    const double et = own_relative_error(w, t.dequant, h, rows, cols);
    EXPECT_LT(et, 0.8 * es) << k << " bits: trellis " << et << ", scalar " << es;
    EXPECT_NEAR(relative_error(w.data(), t, h, 1), et, 1e-9);
  }
}

TEST(QuantTrellis, SettingsDescribeAndValidateThemselves) {
  const QuantSetting st = trellis_setting(4, 4096);
  EXPECT_TRUE(st.trellis);
  EXPECT_EQ(st.group_size, 128);
  EXPECT_EQ(st.str(), "4b trellis g128");
  EXPECT_DOUBLE_EQ(st.bits_per_weight(), 4.125);
  EXPECT_DOUBLE_EQ(st.stored_bits(32, 256), 32.0 * 256 * 4.125);
  EXPECT_EQ(trellis_setting(3, 96).group_size, 32);
  EXPECT_FALSE(trellis_setting(3, 172).trellis);
  EXPECT_NO_THROW(quant_setting_validate(st, 256, "x"));
  QuantSetting asym = st;
  asym.sym = false;
  testutil::expect_one_line_error(
      [&] { quant_setting_validate(asym, 256, "layer"); },
      "layer: a trellis setting is symmetric and has no mix of two widths");
  QuantSetting mixed = st;
  mixed.mix_bits = 5;
  mixed.mix_eighths = 2;
  EXPECT_THROW(quant_setting_validate(mixed, 256, "layer"), Error);
  EXPECT_EQ(quant_format_version(true, true, true), 4);
  EXPECT_EQ(quant_format_version(false, true), 3);
  EXPECT_TRUE(trellis_unit(true, {64, 32}, 64));
  EXPECT_FALSE(trellis_unit(true, {172}, 64));  // rows not tiles
  EXPECT_FALSE(trellis_unit(true, {64}, 172));  // no Hadamard block
  EXPECT_FALSE(trellis_unit(false, {64}, 64));
  // The measurement file keeps the flag.
  Measurement m;
  m.blocks_done = 1;
  m.layers.push_back({"a", 32, 128, {{st, 0.01}, {QuantSetting{4, 128, true}, 0.02}}});
  m.layers[0].errors[0].first = trellis_setting(4, 128);
  const Measurement back = Measurement::from_json(m.to_json(), "m");
  ASSERT_EQ(back.layers[0].errors.size(), 2u);
  EXPECT_EQ(back.layers[0].errors[0].first, trellis_setting(4, 128));
  EXPECT_FALSE(back.layers[0].errors[1].first.trellis);
}

TEST(QuantTrellis, UnitQuantizerRefusesUnrotatedOrUntileableUnits) {
  QuantContext ctx;
  ctx.act_order = true;
  ctx.threads = 1;
  const int n = 64, tokens = 128;
  const std::vector<float> x = gaussian(size_t(tokens) * n, 7);
  UnitQuantizer plain(ctx);
  plain.set_input(x, tokens);  // not rotated (no --hadamard)
  testutil::expect_one_line_error(
      [&] { plain.quantize(gaussian(32 * n, 8), trellis_setting(4, n), nullptr); },
      "trellis 4b trellis g64: the layer's unit is not rotated (trellis layers "
      "need --hadamard and a width with a Hadamard block)");
  ctx.hadamard = true;
  UnitQuantizer rotated(ctx);
  rotated.set_input(x, tokens, "model.layers.0.mlp.gate_proj");
  testutil::expect_one_line_error(
      [&] { rotated.quantize(gaussian(24 * n, 8), trellis_setting(4, n), nullptr); },
      "trellis 4b trellis g64: a [24, 64] weight is not made of 16 x 16 tiles");
  // A rotated, tileable unit: the error agrees with the result's (act-order does not matter).
  double err = -1;
  const std::vector<float> w = gaussian(32 * n, 9, 0.05);
  const QuantizedWeight q = rotated.quantize(w, trellis_setting(4, n), &err);
  EXPECT_TRUE(q.had.active());
  EXPECT_GT(err, 0.0);
  EXPECT_LT(err, 0.05);
  EXPECT_NEAR(rotated.errors(w, {trellis_setting(4, n)})[0], err, 1e-12);
}

// Past kTrellisMeasureRows rows the measurement quantizes 16 evenly spaced tile rows only: its
// error is that of quantizing exactly those rows (tile rows i * tiles / 16), picked here.
TEST(QuantTrellis, TallWeightsAreMeasuredOnEvenlySpacedTileRows) {
  QuantContext ctx;
  ctx.hadamard = true;
  ctx.threads = 2;
  const int n = 32, tokens = 96, rows = 3 * kTrellisMeasureRows;  // 48 tile rows: every third
  UnitQuantizer uq(ctx);
  uq.set_input(gaussian(size_t(tokens) * n, 12), tokens, "model.layers.1.self_attn.o_proj");
  const std::vector<float> w = gaussian(size_t(rows) * n, 13, 0.05);
  std::vector<float> sub;
  for (int i = 0; i < 16; ++i)
    sub.insert(sub.end(), w.begin() + 3 * i * 16 * n, w.begin() + (3 * i + 1) * 16 * n);
  double want = -1;
  uq.quantize(sub, trellis_setting(3, n), &want);
  EXPECT_GT(want, 0.0);
  EXPECT_NEAR(uq.errors(w, {trellis_setting(3, n)})[0], want, 1e-12);
}

}  // namespace
}  // namespace gyre::quant
