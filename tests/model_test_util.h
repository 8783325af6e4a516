// Scaffolding shared by the tests that run one model two ways (quantized vs its float twin, CPU
// vs CUDA): the CUDA backend when a GPU is present, a fixed probe prompt, and the all-position
// logits of both transformers compared against the first one (the reference).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "engine/transformer.h"
#ifdef GYRE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace gyre::mtest {

// The CUDA backend on device 0, or null without a GPU (or in a CPU-only build).
inline std::unique_ptr<Backend> cuda_backend_or_null() {
#ifdef GYRE_HAVE_CUDA
  if (cuda_device_count() > 0) return make_cuda_backend(0, BackendOptions{});
#endif
  return nullptr;
}

// A prompt of in-vocabulary ids for the tiny test models (vocabularies of 512 and more).
inline const std::vector<int32_t> kProbeTokens = {1, 403, 261, 307, 9, 44, 500, 2, 17, 300, 411, 5};

struct LogitsDiff {
  std::vector<float> ref, test;  // [positions x vocab] each
  double max_diff = 0;           // max |test - ref|
  double max_abs = 0;            // max |ref|
  int same_argmax = 0;           // positions whose argmax agrees
  int positions = 0;
};

// Runs `tokens` from position 0 through both transformers (logits at every position).
inline LogitsDiff compare_prompt_logits(Transformer& ref, Transformer& test, int vocab,
                                        const std::vector<int32_t>& tokens = kProbeTokens) {
  LogitsDiff d;
  d.positions = static_cast<int>(tokens.size());
  d.ref.resize(static_cast<size_t>(d.positions) * vocab);
  d.test.resize(d.ref.size());
  ref.forward(tokens.data(), d.positions, 0, d.ref.data(), true);
  test.forward(tokens.data(), d.positions, 0, d.test.data(), true);
  for (int t = 0; t < d.positions; ++t) {
    const float* r = d.ref.data() + static_cast<size_t>(t) * vocab;
    const float* x = d.test.data() + static_cast<size_t>(t) * vocab;
    for (int i = 0; i < vocab; ++i) {
      d.max_diff = std::max(d.max_diff, static_cast<double>(std::fabs(x[i] - r[i])));
      d.max_abs = std::max(d.max_abs, static_cast<double>(std::fabs(r[i])));
    }
    d.same_argmax += std::max_element(r, r + vocab) - r == std::max_element(x, x + vocab) - x;
  }
  return d;
}

}  // namespace gyre::mtest
