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

TEST(Exl2Cuda, TinyLlamaLogitsMatchTheCpuBackend) {
  auto gpu = gpu_backend();
  if (!gpu) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  const auto m = load_model(std::string(GYRE_SOURCE_DIR) + "/tests/data/exl2/llama");
  auto cpu = make_cpu_backend(2);
  Transformer a(m->config, m->weights, *cpu, 64);
  Transformer b(m->config, m->weights, *gpu, 64);
  const std::vector<int32_t> tokens = {1, 403, 261, 307, 9, 44, 500, 2, 17, 300, 411, 5};
  const int n = static_cast<int>(tokens.size()), vocab = m->config.vocab_size;
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
  // FP16 activations on the GPU, as in test_cuda_quant_formats.cc.
  EXPECT_LE(max_diff, 2e-2 * max_abs) << "max |cpu - cuda| " << max_diff;
  EXPECT_GE(same_argmax, n - 1);

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
