// The CUDA forward pass against Hugging Face transformers (float32) on the tiny random-weight
// models of every architecture variant (tests/data/hf_tiny), FP16 weights at FP16 tolerance
// (quantized layouts are checked against the CPU on the same dequantized weights in
// test_cuda_ops / test_cuda_qlinear: against transformers they differ by the quantization error
// itself); plus SmolLM2-135M greedy tokens identical to the CPU backend for 64 steps: the Q4_1
// GGUF, its FP16 twin and the twin converted to 8/6/4/3 bits (skipped without models/).
// Skipped when no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>

#include "backend/backend.h"
#ifdef GYRE_HAVE_CUDA
#include "backend/cuda/qlinear.h"
#endif
#include "core/mapped_file.h"
#include "engine/transformer.h"
#include "hf_reference_util.h"
#include "model/loader.h"
#include "quant/convert.h"
#include "quant/gguf_source.h"

namespace gyre {
namespace {

bool gpu_present() {
  return cuda_available();
}

class CudaHfReference : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaHfReference, LogitsMatchTransformers) {
  if (!gpu_present()) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  auto m = testing::load_hf_tiny(GetParam());
  const int n = static_cast<int>(m->input_ids.size());
  const int vocab = m->config.vocab_size;
  {
    auto gpu = backend_create("cuda:0", BackendOptions{});
    Transformer t(m->config, m->weights, *gpu, 64);
    std::vector<float> logits(static_cast<size_t>(n) * vocab);
    t.forward(m->input_ids.data(), n, 0, logits.data(), true);
    const double tol = 1e-2;
    for (int i = 0; i < n; ++i)
      EXPECT_LT(testing::rel_max_error(&logits[static_cast<size_t>(i) * vocab], m->logits[i]), tol)
          << GetParam() << " position " << i;
    if (m->config.rope.scaling == RopeScaling::DynamicNtk) return;  // see test_hf_reference
    Transformer inc(m->config, m->weights, *gpu, 64);
    std::vector<float> row(static_cast<size_t>(vocab));
    inc.forward(m->input_ids.data(), 5, 0, row.data(), false);
    for (int i = 5; i < n; ++i) {
      inc.forward(&m->input_ids[static_cast<size_t>(i)], 1, i, row.data(), false);
      EXPECT_LT(testing::rel_max_error(row.data(), m->logits[i]), tol)
          << GetParam() << " decode position " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, CudaHfReference,
                         ::testing::ValuesIn(testing::hf_tiny_variants()));

const std::string kSmolPath =
    std::string(GYRE_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

// 64 greedy tokens after a short prompt.
std::vector<int> greedy64(const LoadedModel& model, Backend& b) {
  const std::vector<int> prompt = model.tokenizer->encode("Once upon a time, in a", true);
  Transformer t(model.config, model.weights, b, 128);
  std::vector<float> row(static_cast<size_t>(model.config.vocab_size));
  std::vector<int32_t> ids(prompt.begin(), prompt.end());
  t.forward(ids.data(), static_cast<int>(ids.size()), 0, row.data(), false);
  std::vector<int> out;
  for (int s = 0; s < 64; ++s) {
    const int32_t next =
        static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
    out.push_back(next);
    t.forward(&next, 1, static_cast<int>(prompt.size()) + s, row.data(), false);
  }
  return out;
}

// The GPU's 64 greedy tokens, then the CPU fed the same tokens: at every step the GPU's pick must
// be the CPU's argmax, or a near tie of it (the CPU's logit of the GPU's pick within 2e-3 of the
// row's largest magnitude, FP16 tolerance), at most two near ties. Returns their count; each is
// printed with its gap.
int expect_cpu_agrees(const LoadedModel& model, Backend& gpu, Backend& cpu,
                      const std::string& what) {
  const std::vector<int> g = greedy64(model, gpu);
  const std::vector<int> prompt = model.tokenizer->encode("Once upon a time, in a", true);
  Transformer t(model.config, model.weights, cpu, 128);
  std::vector<float> row(static_cast<size_t>(model.config.vocab_size));
  std::vector<int32_t> ids(prompt.begin(), prompt.end());
  t.forward(ids.data(), static_cast<int>(ids.size()), 0, row.data(), false);
  int ties = 0;
  for (int s = 0; s < 64; ++s) {
    const int best = static_cast<int>(std::max_element(row.begin(), row.end()) - row.begin());
    float amax = 0.f;
    for (const float v : row) amax = std::max(amax, std::fabs(v));
    if (g[s] != best) {
      const float gap = row[best] - row[g[s]];
      EXPECT_LE(gap, 2e-3f * amax) << what << " step " << s << ": GPU " << g[s] << ", CPU " << best;
      std::printf(
          "%s: step %d the GPU took %d, the CPU's argmax is %d, %.5f higher (tolerance %.5f)\n",
          what.c_str(), s, g[s], best, gap, 2e-3f * amax);
      ++ties;
    }
    const int32_t next = g[s];
    t.forward(&next, 1, static_cast<int>(prompt.size()) + s, row.data(), false);
  }
  EXPECT_LE(ties, 2) << what;
  if (ties == 0) std::printf("%s: the same 64 greedy tokens\n", what.c_str());
  return ties;
}

TEST(CudaSmolLM2, GreedyTokensMatchCpuFor64Steps) {
  if (!gpu_present()) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  if (!file_exists(kSmolPath)) GTEST_SKIP() << "no " << kSmolPath;
  auto model = load_model(kSmolPath);
  auto cpu = backend_create("cpu", 0);
  auto gpu = backend_create("cuda:0", 0);
  EXPECT_EQ(greedy64(*model, *gpu), greedy64(*model, *cpu));
}

// The same model as FP16 weights (the GGUF's exported twin) and converted from it to Gyre's
// layouts (round to nearest, every linear layer at one setting, so that both backends read the
// same stored integers): 8 and 4 bits (the GEMV layouts), 3 and 6 (the tiled narrow ones). On
// the H100 (session 14) the greedy tokens were identical for FP16, 4, 3 and 6 bits; at 8 bits the
// GPU took another token at step 9 (expect_cpu_agrees prints the CPU's gap there). Then one GPTQ
// act-order conversion at 4 bits (session 15).
TEST(CudaSmolLM2, TwinAndItsLayoutsMatchCpuFor64Steps) {
  if (!gpu_present()) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  if (!file_exists(kSmolPath)) GTEST_SKIP() << "no " << kSmolPath;
  const std::string twin = ::testing::TempDir() + "/gyre_smol_twin";
  quant::export_gguf_as_hf(kSmolPath, twin);
  const std::string calib = ::testing::TempDir() + "/gyre_smol_calib.txt";
  {
    std::string t;
    for (int k = 0; k < 100; ++k) t += "The cat sat on the mat while the dog slept by the door. ";
    std::ofstream(calib, std::ios::binary) << t;
  }
  // The last settings are GPTQ with act-order (the converter's default): every layer carries a
  // column permutation, and the CUDA upload renumbers the MLP into down_proj's order; then every
  // layer a 4/3 mix (half the groups at 4 bits: two parts, no permutation), which decodes through
  // the two-part kernel (qlinear_mixed_stream.cu).
  const std::pair<std::string, bool> settings[] = {
      {"", true},     {"8:64", true},  {"4:64", true},         {"3:64:asym", true},
      {"6:64", true}, {"4:64", false}, {"3:64:sym:4x4", false}};
  for (const auto& [setting, rtn] : settings) {
    std::string dir = twin;
    const std::string name = setting.empty() ? "FP16" : setting + (rtn ? "" : " GPTQ act-order");
    if (!setting.empty()) {
      quant::ConvertOptions o;
      o.model = twin;
      o.out = ::testing::TempDir() + "/gyre_smol_" + std::to_string(setting.size()) + setting[0] +
              (rtn ? "" : "_gptq");
      o.uniform = setting;
      o.rtn = rtn;
      o.head_bits = 0;
      o.rows = 2;
      o.length = 32;
      o.device = rtn ? "cpu" : "cuda";  // GPTQ of 210 layers: minutes on the CPU
      o.progress = false;
      o.calibration = calib;
      quant::convert_model(o);
      dir = o.out;
    }
    auto model = load_model(dir);
    auto cpu = backend_create("cpu", 0);
    auto gpu = backend_create("cuda:0", 0);
#ifdef GYRE_HAVE_CUDA
    const uint64_t pairs = qlinear_detail::qlinear_pair_launches();
#endif
    expect_cpu_agrees(*model, *gpu, *cpu, name);
#ifdef GYRE_HAVE_CUDA
    if (setting.find('x') != std::string::npos) {
      EXPECT_GT(qlinear_detail::qlinear_pair_launches(), pairs) << name;
    }
#endif
  }
}

}  // namespace
}  // namespace gyre
