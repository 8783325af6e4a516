// The tiny EXL2 Llama of tests/data/exl2 (layers kept quantized: one-width QWeightHost with the
// act-order perm, two-width QMixedHost, F16 for the 3-width down_proj; model/exl2.h) on the CUDA
// backend against the CPU backend running the same weights (the reference, itself checked against
// numpy in test_exl2_quant.cc). Skipped when no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "engine/transformer.h"
#include "model/loader.h"
#include "model_test_util.h"

namespace gyre {
namespace {

TEST(Exl2Cuda, TinyLlamaLogitsMatchTheCpuBackend) {
  auto gpu = mtest::cuda_backend_or_null();
  if (!gpu) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  const auto m = load_model(std::string(GYRE_SOURCE_DIR) + "/tests/data/exl2/llama");
  auto cpu = make_cpu_backend(2);
  Transformer a(m->config, m->weights, *cpu, 64);
  Transformer b(m->config, m->weights, *gpu, 64);
  const int n = static_cast<int>(mtest::kProbeTokens.size()), vocab = m->config.vocab_size;
  const mtest::LogitsDiff d = mtest::compare_prompt_logits(a, b, vocab);
  const double max_abs = d.max_abs;
  EXPECT_GT(max_abs, 0.1);
  // FP16 activations on the GPU, as in test_cuda_quant_formats.cc.
  EXPECT_LE(d.max_diff, 2e-2 * max_abs) << "max |cpu - cuda| " << d.max_diff;
  EXPECT_GE(d.same_argmax, n - 1);

  // One token at a time (the decode GEMV path) after the prompt agrees too.
  std::vector<float> da(static_cast<size_t>(vocab)), db(da.size());
  const int32_t next = 77;
  a.forward(&next, 1, n, da.data(), false);
  b.forward(&next, 1, n, db.data(), false);
  double decode_diff = 0;
  for (int i = 0; i < vocab; ++i)
    decode_diff = std::max(decode_diff, static_cast<double>(std::fabs(da[i] - db[i])));
  EXPECT_LE(decode_diff, 2e-2 * max_abs) << "decode max |cpu - cuda| " << decode_diff;
}

}  // namespace
}  // namespace gyre
