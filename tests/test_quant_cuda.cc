// The quantizer's GPU path (quant/gptq_device.h) against the CPU code it replaces, the oracle:
// Hessians, GPTQ's relative errors at every candidate setting (mixes of two widths included), the
// quantized outputs, and a whole measurement (block forward on the CUDA backend included) of a
// small synthetic model. Layers of awkward sizes: widths that only some group sizes divide, rows
// not a multiple of the GPU's row tiles, fewer tokens than columns (damping needed) and a column
// that never sees input. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/backend.h"
#include "core/error.h"
#include "quant/gptq.h"
#include "quant/gptq_device.h"
#include "quant/measure.h"
#include "quant/synthetic.h"
#include "quant/unit_quant.h"

namespace gyre::quant {
namespace {

struct Layer {
  int tokens, n, rows;
};

std::vector<float> correlated_input(int tokens, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(tokens) * n);
  for (int t = 0; t < tokens; ++t) {
    const float common = nd(rng);
    for (int k = 0; k < n; ++k)
      x[static_cast<size_t>(t) * n + k] = (k == 3 ? 0.0f : 0.6f * common + nd(rng) * (1 + k % 5));
  }
  return x;
}

std::vector<float> weights(int rows, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> w(static_cast<size_t>(rows) * n);
  for (float& v : w) v = nd(rng);
  return w;
}

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

// GPTQ of w at st on both quantizers: the same integers, scales, dequantized values and (for a
// mix) wide groups, up to the rare value that summation order rounds the other way.
void expect_same_quantization(UnitQuantizer& on_cpu, UnitQuantizer& on_gpu,
                              const std::vector<float>& w, const QuantSetting& st) {
  double err_cpu = 0, err_gpu = 0;
  const QuantizedWeight a = on_cpu.quantize(w, st, &err_cpu), b = on_gpu.quantize(w, st, &err_gpu);
  ASSERT_EQ(a.q.size(), b.q.size());
  ASSERT_EQ(a.scales.size(), b.scales.size());
  ASSERT_EQ(a.mins.size(), b.mins.size());
  EXPECT_EQ(a.hi_groups, b.hi_groups) << st.str();
  EXPECT_EQ(static_cast<int64_t>(b.hi_groups.size()), st.mix_groups(b.cols)) << st.str();
  size_t differ = 0, dequant_differ = 0;
  for (size_t i = 0; i < a.q.size(); ++i) {
    differ += a.q[i] != b.q[i];
    dequant_differ += a.dequant[i] != b.dequant[i];
    EXPECT_NEAR(a.dequant[i], b.dequant[i], 0.05f) << i;
  }
  EXPECT_LE(differ, a.q.size() / 200) << st.str();
  EXPECT_LE(dequant_differ, a.q.size() / 200) << st.str();
  size_t scales_differ = 0;
  for (size_t i = 0; i < a.scales.size(); ++i) scales_differ += a.scales[i] != b.scales[i];
  EXPECT_LE(scales_differ, a.scales.size() / 50) << st.str();
  EXPECT_NEAR(err_gpu, err_cpu, 2e-3 * err_cpu) << st.str();
}

class QuantCuda : public ::testing::TestWithParam<std::tuple<Layer, bool, bool>> {};

TEST_P(QuantCuda, MatchesTheCpuGptq) {
  SKIP_WITHOUT_GPU();
  const auto [layer, act_order, clip] = GetParam();
  const std::vector<float> x = correlated_input(layer.tokens, layer.n, 7);
  const std::vector<float> w = weights(layer.rows, layer.n, 11);
  QuantContext cpu_ctx;
  cpu_ctx.act_order = act_order;
  cpu_ctx.clip_search = clip;
  cpu_ctx.threads = 2;
  QuantContext gpu_ctx = cpu_ctx;
  auto gpu = make_gptq_device("cuda");
  gpu_ctx.gpu = gpu.get();
  UnitQuantizer on_cpu(cpu_ctx), on_gpu(gpu_ctx);
  on_cpu.set_input(x, layer.tokens);
  on_gpu.set_input(x, layer.tokens);

  const std::vector<double> h_cpu = hessian_of(x, layer.tokens, layer.n, 1);
  const std::vector<double> h_gpu = gpu->hessian();
  ASSERT_EQ(h_cpu.size(), h_gpu.size());
  for (size_t i = 0; i < h_cpu.size(); ++i)
    ASSERT_NEAR(h_gpu[i], h_cpu[i], 1e-9 * (1.0 + std::fabs(h_cpu[i]))) << i;

  const std::vector<QuantSetting> cands = settings_for(candidate_settings(), layer.n);
  ASSERT_FALSE(cands.empty());
  const std::vector<double> e_cpu = on_cpu.errors(w, cands), e_gpu = on_gpu.errors(w, cands);
  for (size_t i = 0; i < cands.size(); ++i) {
    EXPECT_GT(e_cpu[i], 0.0) << cands[i].str();
    // Summation order differs (GEMM vs loops), so a rare value rounds the other way.
    EXPECT_NEAR(e_gpu[i], e_cpu[i], 2e-3 * e_cpu[i]) << cands[i].str();
  }

  for (const QuantSetting& st : {cands.front(), cands.back()})
    expect_same_quantization(on_cpu, on_gpu, w, st);
}

INSTANTIATE_TEST_SUITE_P(AwkwardLayers, QuantCuda,
                         ::testing::Values(std::make_tuple(Layer{300, 96, 37}, true, true),
                                           std::make_tuple(Layer{50, 160, 70}, true, false),
                                           std::make_tuple(Layer{400, 384, 65}, false, true),
                                           std::make_tuple(Layer{260, 192, 129}, true, true)));

// Mixes of two widths (gyre_qformat.h): the GPU quantizes each group at its own width, with the
// CPU's choice of wide groups. Every group size the width allows, sym and asym, the second width
// wider or narrower, stacked with a one-width setting in one run.
class QuantCudaMix : public ::testing::TestWithParam<std::tuple<Layer, bool, bool>> {};

TEST_P(QuantCudaMix, MatchesTheCpuGptq) {
  SKIP_WITHOUT_GPU();
  const auto [layer, act_order, clip] = GetParam();
  const std::vector<float> x = correlated_input(layer.tokens, layer.n, 5);
  const std::vector<float> w = weights(layer.rows, layer.n, 13);
  QuantContext cpu_ctx;
  cpu_ctx.act_order = act_order;
  cpu_ctx.clip_search = clip;
  cpu_ctx.threads = 2;
  QuantContext gpu_ctx = cpu_ctx;
  auto gpu = make_gptq_device("cuda");
  gpu_ctx.gpu = gpu.get();
  UnitQuantizer on_cpu(cpu_ctx), on_gpu(gpu_ctx);
  on_cpu.set_input(x, layer.tokens);
  on_gpu.set_input(x, layer.tokens);

  std::vector<QuantSetting> mixes;
  for (int g : {32, 64, 128}) {
    if (layer.n % g != 0 || layer.n / g < 2) continue;
    mixes.push_back({3, g, true, 4, 2});
    mixes.push_back({2, g, false, 3, 4});
    mixes.push_back({4, g, true, 3, 3});   // the chosen groups narrower
    mixes.push_back({6, g, false, 8, 7});  // all but one group wide (rounded)
  }
  ASSERT_GE(mixes.size(), 4u);
  std::vector<QuantSetting> stacked = mixes;
  stacked.insert(stacked.begin() + 2, QuantSetting{3, mixes[0].group_size, true});
  const std::vector<double> e_cpu = on_cpu.errors(w, stacked), e_gpu = on_gpu.errors(w, stacked);
  for (size_t i = 0; i < stacked.size(); ++i) {
    EXPECT_GT(e_cpu[i], 0.0) << stacked[i].str();
    EXPECT_NEAR(e_gpu[i], e_cpu[i], 2e-3 * e_cpu[i]) << stacked[i].str();
  }
  // A quarter of the groups one bit wider beats the narrow width alone (the flags reach the
  // kernel).
  EXPECT_LT(e_gpu[0], e_gpu[2]);
  for (const QuantSetting& st : mixes) expect_same_quantization(on_cpu, on_gpu, w, st);
}

INSTANTIATE_TEST_SUITE_P(AwkwardLayers, QuantCudaMix,
                         ::testing::Values(std::make_tuple(Layer{300, 192, 37}, true, true),
                                           std::make_tuple(Layer{50, 256, 70}, false, false),
                                           std::make_tuple(Layer{400, 384, 129}, true, false),
                                           std::make_tuple(Layer{260, 160, 33}, false, true)));

// A small synthetic model measured three ways: all on the CPU (the oracle); the forward on the
// CPU with GPTQ and the errors on the GPU (must agree closely: same inputs); everything on the
// GPU (the CUDA backend's activations are FP16, so inputs, Hessians and with act-order even the
// visiting order differ a little: only the total error is compared, loosely).
TEST(QuantCudaMeasure, SyntheticModelMeasuresLikeTheCpu) {
  SKIP_WITHOUT_GPU();
  ModelConfig c;
  c.arch = "llama";
  c.dim = 128, c.hidden_dim = 352, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2;
  c.head_dim = 32, c.vocab_size = 300, c.max_seq_len = 64, c.norm_eps = 1e-5f;
  c.rope.rot_dim = 32;
  LoadedModel lm;
  lm.config = c;
  QuantContext ctx;
  ctx.model = &lm;
  ctx.threads = 2;
  ctx.progress = false;
  std::mt19937 rng(3);
  for (int r = 0; r < 8; ++r) {
    std::vector<int> row;
    for (int i = 0; i < 64; ++i) row.push_back(static_cast<int>(rng() % 300));
    ctx.rows.push_back(row);
  }
  ctx.blocks = [&](int layer) { return synthetic_block(c, layer, 2); };
  ctx.embed = [&](const std::vector<std::vector<int>>& rows) {
    std::vector<float> out;
    for (const auto& row : rows)
      for (int id : row)
        for (int k = 0; k < c.dim; ++k) out.push_back(std::sin(0.37f * id + 0.11f * k));
    return out;
  };
  auto cpu_backend = backend_create("cpu", 2);
  ctx.backend = cpu_backend.get();
  Measurement on_cpu, gptq_on_gpu, all_on_gpu;
  measure(ctx, on_cpu, [](const Measurement&) {});
  auto gpu = make_gptq_device("cuda");
  ctx.gpu = gpu.get();
  measure(ctx, gptq_on_gpu, [](const Measurement&) {});
  auto gpu_backend = backend_create("cuda", 2);
  ctx.backend = gpu_backend.get();
  measure(ctx, all_on_gpu, [](const Measurement&) {});
  ASSERT_EQ(on_cpu.layers.size(), 14u);
  ASSERT_EQ(gptq_on_gpu.layers.size(), 14u);
  ASSERT_EQ(all_on_gpu.layers.size(), 14u);
  double total_cpu = 0, total_gpu = 0;
  // Every setting, the mixes of two widths included, on both devices.
  size_t mixes = 0;
  for (size_t l = 0; l < on_cpu.layers.size(); ++l) {
    const LayerErrors &a = on_cpu.layers[l], &b = gptq_on_gpu.layers[l], &g = all_on_gpu.layers[l];
    ASSERT_EQ(a.name, b.name);
    ASSERT_EQ(a.errors.size(), b.errors.size());
    ASSERT_EQ(a.errors.size(), g.errors.size());
    for (size_t i = 0; i < a.errors.size(); ++i) {
      ASSERT_EQ(a.errors[i].first.str(), b.errors[i].first.str());
      ASSERT_EQ(a.errors[i].first.str(), g.errors[i].first.str());
      mixes += a.errors[i].first.mixed();
      EXPECT_NEAR(b.errors[i].second, a.errors[i].second, 2e-3 * a.errors[i].second)
          << a.name << " " << a.errors[i].first.str();
      total_cpu += a.errors[i].second;
      total_gpu += g.errors[i].second;
    }
  }
  EXPECT_GT(mixes, 0u);
  EXPECT_NEAR(total_gpu, total_cpu, 0.1 * total_cpu);
}

TEST(QuantCudaDevice, BadDeviceNamesAreOneLineErrors) {
  EXPECT_THROW(make_gptq_device("gpu"), Error);
  EXPECT_THROW(make_gptq_device("cuda:x"), Error);
  EXPECT_THROW(make_gptq_device("cuda:99"), Error);
}

}  // namespace
}  // namespace gyre::quant
