// Quantized checkpoint formats on the CUDA backend, against the CPU backend running the same
// weights dequantized (the reference, itself checked against the format specs in test_gptq.cc and
// test_quant_convert.cc): the tiny GPTQ Llama of tests/data/gptq (4-bit, asymmetric, act-order)
// and a `gyre convert` output of stories260K (mixed bit widths). Skipped when no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "engine/generator.h"
#include "engine/transformer.h"
#include "model/loader.h"
#include "model_test_util.h"
#include "quant/convert.h"

namespace gyre {
namespace {

// All-position logits of one prompt on both backends: FP16-tolerance agreement, same argmax.
void expect_same_logits(const LoadedModel& m, Backend& gpu) {
  auto cpu = make_cpu_backend(2);
  Transformer a(m.config, m.weights, *cpu, 64);
  Transformer b(m.config, m.weights, gpu, 64);
  const mtest::LogitsDiff d = mtest::compare_prompt_logits(a, b, m.config.vocab_size);
  EXPECT_GT(d.max_abs, 0.1);
  EXPECT_LE(d.max_diff, 2e-2 * d.max_abs) << "max |cpu - cuda| " << d.max_diff;
  EXPECT_GE(d.same_argmax, d.positions - 1);
}

TEST(QuantFormatsCuda, GptqTinyLlamaMatchesTheCpuBackend) {
  auto gpu = mtest::cuda_backend_or_null();
  if (!gpu) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  const auto m = load_model(std::string(GYRE_SOURCE_DIR) + "/tests/data/gptq/llama");
  expect_same_logits(*m, *gpu);
}

// Converts stories260K with the given settings (uniform "BITS:GROUP[:asym]" or, when empty, the
// mixed 4.0 bpw choice) and loads the result.
std::unique_ptr<LoadedModel> converted_stories(const std::string& uniform, const std::string& tag) {
  quant::ConvertOptions o;
  o.model = std::string(GYRE_FIXTURES) + "/stories260K";
  o.out = ::testing::TempDir() + "/gyre_cuda_convert_" + tag;
  std::filesystem::remove_all(o.out);
  o.rows = 8;
  o.length = 64;
  o.threads = 2;
  o.head_bits = 8;
  o.progress = false;
  o.bpw = 4.0;
  o.uniform = uniform;
  quant::convert_model(o);
  return load_model(o.out);
}

// Greedy generation on the CPU, then both backends score that sequence (teacher forcing): at
// every position where the CPU's best logit leads the runner-up by more than 0.05, the CUDA
// argmax must agree; and free-running greedy tokens must agree up to the first near-tie.
void expect_same_greedy(const LoadedModel& m, Backend& gpu, const std::string& tag) {
  auto cpu = make_cpu_backend(2);
  Transformer tc(m.config, m.weights, *cpu, 256);
  Transformer tg(m.config, m.weights, gpu, 256);
  GenerationSettings s;
  s.max_tokens = 64;
  s.ignore_eos = true;
  s.sampler.temperature = 0;  // greedy
  const auto rc = Generator(tc, *m.tokenizer).generate("Once upon a time", s);
  const auto rg = Generator(tg, *m.tokenizer).generate("Once upon a time", s);
  ASSERT_EQ(rc.tokens.size(), 64u);
  std::vector<int32_t> seq(rc.prompt_ids.begin(), rc.prompt_ids.end());
  seq.insert(seq.end(), rc.tokens.begin(), rc.tokens.end());
  const int n = static_cast<int>(seq.size()), vocab = m.config.vocab_size;
  std::vector<float> la(static_cast<size_t>(n) * vocab), lb(la.size());
  Transformer sc(m.config, m.weights, *cpu, 256), sg(m.config, m.weights, gpu, 256);
  sc.forward(seq.data(), n, 0, la.data(), true);
  sg.forward(seq.data(), n, 0, lb.data(), true);
  double worst = 0;
  int worst_pos = 0, first_tie = n;
  for (int t = 0; t < n; ++t) {
    const float* ra = la.data() + static_cast<size_t>(t) * vocab;
    const float* rb = lb.data() + static_cast<size_t>(t) * vocab;
    for (int i = 0; i < vocab; ++i)
      if (std::fabs(ra[i] - rb[i]) > worst) worst = std::fabs(ra[i] - rb[i]), worst_pos = t;
    std::vector<float> sorted(ra, ra + vocab);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    const bool near_tie = sorted[0] - sorted[1] <= 0.05f;
    if (near_tie) first_tie = std::min(first_tie, t);
    if (!near_tie) {
      EXPECT_EQ(std::max_element(ra, ra + vocab) - ra, std::max_element(rb, rb + vocab) - rb)
          << tag << ": position " << t << " margin " << sorted[0] - sorted[1];
    }
  }
  std::printf("[ info ] %s: max |cpu - cuda| logit %.4f at position %d of %d\n", tag.c_str(), worst,
              worst_pos, n);
  const size_t agree =
      static_cast<size_t>(std::max(0, first_tie - static_cast<int>(rc.prompt_ids.size())));
  for (size_t i = 0; i < std::min({agree, rc.tokens.size(), rg.tokens.size()}); ++i)
    ASSERT_EQ(rc.tokens[i], rg.tokens[i]) << tag << ": greedy step " << i;
}

TEST(QuantFormatsCuda, ConvertedStories260KGreedyTokensMatchTheCpuBackend) {
  auto gpu = mtest::cuda_backend_or_null();
  if (!gpu) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  expect_same_greedy(*load_model(std::string(GYRE_FIXTURES) + "/stories260K"), *gpu, "float");
  const auto mixed = converted_stories("", "mixed");
  expect_same_logits(*mixed, *gpu);
  expect_same_greedy(*mixed, *gpu, "mixed 4.0 bpw");
  for (const char* u : {"4:32", "4:32:asym", "8:32", "3:32", "6:32"})
    expect_same_greedy(*converted_stories(u, std::string("u") + u[0]), *gpu, u);
}

}  // namespace
}  // namespace gyre
