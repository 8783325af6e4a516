// Quantized checkpoint formats on the CUDA backend, against the CPU backend running the same
// weights dequantized (the reference, itself checked against the format specs in test_gptq.cc and
// test_quant_convert.cc): the tiny GPTQ Llama of tests/data/gptq (4-bit, asymmetric, act-order)
// and a `gyre convert` output of stories260K (mixed bit widths). Skipped when no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "engine/generator.h"
#include "engine/transformer.h"
#include "model/loader.h"
#include "quant/convert.h"
#ifdef GYRE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace gyre {
namespace {

std::unique_ptr<Backend> gpu_backend() {
#ifdef GYRE_HAVE_CUDA
  if (cuda_device_count() > 0) return make_cuda_backend(0, BackendOptions{});
#endif
  return nullptr;
}

// All-position logits of one prompt on both backends: FP16-tolerance agreement, same argmax.
void expect_same_logits(const LoadedModel& m, Backend& gpu) {
  auto cpu = make_cpu_backend(2);
  Transformer a(m.config, m.weights, *cpu, 64);
  Transformer b(m.config, m.weights, gpu, 64);
  const std::vector<int32_t> tokens = {1, 403, 261, 307, 9, 44, 500, 2, 17, 300, 411, 5};
  const int n = static_cast<int>(tokens.size()), vocab = m.config.vocab_size;
  std::vector<float> la(static_cast<size_t>(n) * vocab), lb(la.size());
  a.forward(tokens.data(), n, 0, la.data(), true);
  b.forward(tokens.data(), n, 0, lb.data(), true);
  double max_diff = 0, max_abs = 0;
  int same_argmax = 0;
  for (int t = 0; t < n; ++t) {
    const float* ra = la.data() + static_cast<size_t>(t) * vocab;
    const float* rb = lb.data() + static_cast<size_t>(t) * vocab;
    for (int i = 0; i < vocab; ++i) {
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(ra[i] - rb[i])));
      max_abs = std::max(max_abs, static_cast<double>(std::fabs(ra[i])));
    }
    same_argmax += std::max_element(ra, ra + vocab) - ra == std::max_element(rb, rb + vocab) - rb;
  }
  EXPECT_GT(max_abs, 0.1);
  EXPECT_LE(max_diff, 2e-2 * max_abs) << "max |cpu - cuda| " << max_diff;
  EXPECT_GE(same_argmax, n - 1);
}

TEST(QuantFormatsCuda, GptqTinyLlamaMatchesTheCpuBackend) {
  auto gpu = gpu_backend();
  if (!gpu) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  const auto m = load_model(std::string(GYRE_SOURCE_DIR) + "/tests/data/gptq/llama");
  expect_same_logits(*m, *gpu);
}

TEST(QuantFormatsCuda, ConvertedStories260KGreedyTokensMatchTheCpuBackend) {
  auto gpu = gpu_backend();
  if (!gpu) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  quant::ConvertOptions o;
  o.model = std::string(GYRE_FIXTURES) + "/stories260K";
  o.out = ::testing::TempDir() + "/gyre_cuda_convert_s4";
  std::filesystem::remove_all(o.out);
  o.rows = 8;
  o.length = 64;
  o.threads = 2;
  o.head_bits = 8;
  o.progress = false;
  o.bpw = 4.0;
  quant::convert_model(o);
  const auto m = load_model(o.out);
  expect_same_logits(*m, *gpu);

  auto cpu = make_cpu_backend(2);
  Transformer tc(m->config, m->weights, *cpu, 256);
  Transformer tg(m->config, m->weights, *gpu, 256);
  GenerationSettings s;
  s.max_tokens = 64;
  s.ignore_eos = true;
  const auto rc = Generator(tc, *m->tokenizer).generate("Once upon a time", s);
  const auto rg = Generator(tg, *m->tokenizer).generate("Once upon a time", s);
  ASSERT_EQ(rc.tokens.size(), 64u);
  EXPECT_EQ(rc.tokens, rg.tokens) << "cpu: " << rc.text << "\ncuda: " << rg.text;
}

}  // namespace
}  // namespace gyre
