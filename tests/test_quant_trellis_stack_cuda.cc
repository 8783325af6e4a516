// Stacked trellis LDLQ sweeps on the GPU (GptqDevice::trellis_errors / quantize_trellis and the
// UnitQuantizer calls for several weights): several weights of one input, each at one or more
// K, in one sweep must give what one call per weight gives. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "quant/gptq_device.h"
#include "quant/gptq_trellis.h"
#include "quant/measure.h"
#include "quant/unit_quant.h"

namespace gyre::quant {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

std::vector<float> input(int tokens, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(tokens) * n);
  for (int t = 0; t < tokens; ++t) {
    const float common = nd(rng);
    for (int c = 0; c < n; ++c)
      x[static_cast<size_t>(t) * n + c] = c == 3 ? 0.0f : 0.6f * common + nd(rng) * (1 + c % 5);
  }
  return x;
}

std::vector<float> weight(int rows, int n, uint32_t seed, float sd) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> w(static_cast<size_t>(rows) * n);
  for (float& v : w) v = nd(rng);
  return w;
}

QuantSetting trellis_k(int k, int group) {
  QuantSetting st;
  st.bits = k;
  st.group_size = group;
  st.trellis = true;
  return st;
}

// Three weights (different scales) x three K in one sweep against one errors() per weight.
TEST(QuantTrellisStack, ErrorsOfSeveralWeightsMatchOneCallEach) {
  SKIP_WITHOUT_GPU();
  constexpr int kTokens = 300, kRows = 32, kCols = 192;
  const std::vector<float> x = input(kTokens, kCols, 1);
  std::vector<std::vector<float>> w;
  for (int i = 0; i < 3; ++i) w.push_back(weight(kRows, kCols, 10 + i, 0.02f * (i + 1)));
  const std::vector<QuantSetting> settings = {trellis_k(4, 64), trellis_k(2, 64), trellis_k(6, 64)};
  auto gpu = make_gptq_device("cuda");
  gpu->set_input(x.data(), kTokens, kCols, 0.01, false, false);
  const std::vector<std::vector<double>> stacked =
      gpu->trellis_errors({w[0].data(), w[1].data(), w[2].data()}, kRows, settings);
  ASSERT_EQ(stacked.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const std::vector<double> alone = gpu->errors(w[i].data(), kRows, settings);
    ASSERT_EQ(stacked[i].size(), settings.size());
    for (size_t j = 0; j < settings.size(); ++j) {
      EXPECT_NEAR(stacked[i][j], alone[j], 1e-6 * alone[j])
          << "weight " << i << " K " << settings[j].bits;
      EXPECT_GT(stacked[i][j], 0.0);
    }
    std::printf("weight %d: stacked %.6f %.6f %.6f, alone %.6f %.6f %.6f\n", i, stacked[i][0],
                stacked[i][1], stacked[i][2], alone[0], alone[1], alone[2]);
  }
}

// Two weights at different K quantized in one sweep: the words, scales, dequantized values and
// errors of one quantize() each (tiles may differ only where float rounding flips a decision).
TEST(QuantTrellisStack, QuantizeOfTwoWeightsMatchesOneCallEach) {
  SKIP_WITHOUT_GPU();
  constexpr int kTokens = 260, kRows = 48, kCols = 320;
  const std::vector<float> x = input(kTokens, kCols, 2);
  const std::vector<float> a = weight(kRows, kCols, 20, 0.03f), b = weight(kRows, kCols, 21, 0.05f);
  const std::vector<QuantSetting> settings = {trellis_k(5, 64), trellis_k(3, 64)};
  auto gpu = make_gptq_device("cuda");
  gpu->set_input(x.data(), kTokens, kCols, 0.01, true, false);
  std::vector<double> errs;
  const std::vector<QuantizedWeight> qs =
      gpu->quantize_trellis({a.data(), b.data()}, kRows, settings, &errs);
  ASSERT_EQ(qs.size(), 2u);
  ASSERT_EQ(errs.size(), 2u);
  const std::vector<float>* ws[2] = {&a, &b};
  for (int i = 0; i < 2; ++i) {
    double err = 0.0;
    const QuantizedWeight q = gpu->quantize(ws[i]->data(), kRows, settings[i], &err);
    EXPECT_NEAR(errs[i], err, 1e-6 * err) << i;
    ASSERT_EQ(qs[i].trellis.size(), q.trellis.size());
    ASSERT_EQ(qs[i].scales.size(), q.scales.size());
    ASSERT_EQ(qs[i].dequant.size(), q.dequant.size());
    EXPECT_EQ(qs[i].setting.bits, settings[i].bits);
    EXPECT_TRUE(qs[i].q.empty());
    size_t words_differ = 0, scales_differ = 0;
    for (size_t k = 0; k < q.trellis.size(); ++k) words_differ += qs[i].trellis[k] != q.trellis[k];
    for (size_t k = 0; k < q.scales.size(); ++k) scales_differ += qs[i].scales[k] != q.scales[k];
    double max_dq = 0.0;
    for (size_t k = 0; k < q.dequant.size(); ++k)
      max_dq = std::max(max_dq, double(std::abs(qs[i].dequant[k] - q.dequant[k])));
    std::printf(
        "weight %d K=%d: error stacked %.6f alone %.6f; %zu of %zu words, %zu scales "
        "differ; max dequant difference %.3g\n",
        i, settings[i].bits, errs[i], err, words_differ, q.trellis.size(), scales_differ, max_dq);
    EXPECT_LE(words_differ, q.trellis.size() / 100);
    EXPECT_LE(scales_differ, q.scales.size() / 100);
  }
}

// The converter's calls: UnitQuantizer::errors and ::quantize for several weights on the GPU
// (rotated unit, target correction on) against one call per weight.
TEST(QuantTrellisStack, UnitQuantizerStacksLikeOneCallEach) {
  SKIP_WITHOUT_GPU();
  constexpr int kTokens = 300, kRows = kTrellisMeasureRows + 32, kCols = 128;
  QuantContext ctx;
  ctx.hadamard = true;
  ctx.target_correction = true;
  ctx.threads = 2;
  auto gpu = make_gptq_device("cuda");
  ctx.gpu = gpu.get();
  const std::vector<float> x = input(kTokens, kCols, 3);
  std::vector<float> x_fp = x;
  for (size_t i = 0; i < x_fp.size(); i += 7) x_fp[i] *= 1.05f;
  const std::vector<float> a = weight(kRows, kCols, 30, 0.04f), b = weight(kRows, kCols, 31, 0.02f);
  UnitQuantizer uq(ctx, /*refine=*/true);
  uq.set_input(x, kTokens, "model.layers.0.mlp.gate_proj", &x_fp);
  const std::vector<QuantSetting> cands = {trellis_setting(2, kCols), trellis_setting(4, kCols)};
  // c is taller (as q beside k and v): its sample has the others' rows, so it stacks too.
  const std::vector<float> c = weight(kRows + 80, kCols, 32, 0.03f);
  const std::vector<std::vector<double>> e = uq.errors_many({&a, &b, &c}, cands);
  ASSERT_EQ(e.size(), 3u);
  const std::vector<double> ea = uq.errors(a, cands), eb = uq.errors(b, cands),
                            ec = uq.errors(c, cands);
  for (size_t j = 0; j < cands.size(); ++j) {
    EXPECT_NEAR(e[0][j], ea[j], 1e-6 * ea[j]);
    EXPECT_NEAR(e[1][j], eb[j], 1e-6 * eb[j]);
    EXPECT_NEAR(e[2][j], ec[j], 1e-6 * ec[j]);
  }
  std::vector<double> errs;
  const std::vector<QuantSetting> sts = {trellis_setting(4, kCols), trellis_setting(3, kCols)};
  const std::vector<QuantizedWeight> qs = uq.quantize_many({&a, &b}, sts, errs);
  ASSERT_EQ(qs.size(), 2u);
  double err_a = 0.0, err_b = 0.0;
  const QuantizedWeight qa = uq.quantize(a, sts[0], &err_a), qb = uq.quantize(b, sts[1], &err_b);
  EXPECT_NEAR(errs[0], err_a, 1e-6 * err_a);
  EXPECT_NEAR(errs[1], err_b, 1e-6 * err_b);
  EXPECT_TRUE(qs[0].had.active());
  EXPECT_TRUE(qs[1].had.active());
  ASSERT_EQ(qs[0].dequant.size(), qa.dequant.size());
  ASSERT_EQ(qs[1].dequant.size(), qb.dequant.size());
  double max_diff = 0.0, max_abs = 0.0;
  for (size_t k = 0; k < qa.dequant.size(); ++k) {
    max_diff = std::max(max_diff, double(std::abs(qs[0].dequant[k] - qa.dequant[k])));
    max_abs = std::max(max_abs, double(std::abs(qa.dequant[k])));
  }
  EXPECT_LT(max_diff, 1e-5 * max_abs);  // unrotated back like the single call's
  std::printf("UnitQuantizer stacked: errors %.6f %.6f (alone %.6f %.6f), dequant max diff %.3g\n",
              errs[0], errs[1], err_a, err_b, max_diff);
}

}  // namespace
}  // namespace gyre::quant
