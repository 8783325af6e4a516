// The CUDA forward pass against Hugging Face transformers (float32) on the tiny random-weight
// models of every architecture variant (tests/data/hf_tiny), FP16 weights at FP16 tolerance
// (quantized layouts are checked against the CPU on the same dequantized weights in
// test_cuda_ops / test_cuda_qlinear: against transformers they differ by the quantization error
// itself); plus SmolLM2-135M (Q4_1) greedy tokens identical to the CPU backend for 64 steps.
// Skipped when no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>

#include "backend/backend.h"
#include "core/mapped_file.h"
#include "engine/transformer.h"
#include "hf_reference_util.h"
#include "model/loader.h"

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

TEST(CudaSmolLM2, GreedyTokensMatchCpuFor64Steps) {
  if (!gpu_present()) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  const std::string path = std::string(GYRE_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!file_exists(path)) GTEST_SKIP() << "no " << path;
  auto model = load_model(path);
  const std::vector<int> prompt = model->tokenizer->encode("Once upon a time, in a", true);
  auto greedy = [&](Backend& b) {
    Transformer t(model->config, model->weights, b, 128);
    std::vector<float> row(static_cast<size_t>(model->config.vocab_size));
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
  };
  auto cpu = backend_create("cpu", 0);
  auto gpu = backend_create("cuda:0", 0);
  EXPECT_EQ(greedy(*gpu), greedy(*cpu));
}

}  // namespace
}  // namespace gyre
