// Perplexity for the quantizer's tests and quality table: non-overlapping windows of `ctx`
// tokens, each starting with BOS, on the CPU backend, every position after BOS scored. A stand-in
// until `gyre perplexity` (src/engine, another branch) lands; keep it here so it can be swapped.
#pragma once
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/transformer.h"
#include "model/loader.h"

namespace gyre::test {

struct PerplexityResult {
  double ppl = 0;
  int64_t tokens = 0;
};

inline PerplexityResult quant_perplexity(const LoadedModel& m, const std::string& text, int ctx,
                                         int64_t max_tokens, int threads) {
  auto backend = backend_create("cpu", threads);
  Transformer tf(m.config, m.weights, *backend, ctx);
  const std::vector<int> ids = m.tokenizer->encode(text, false);
  const int vocab = m.config.vocab_size;
  const int body = ctx - 1;
  std::vector<float> logits;
  double nll = 0;
  int64_t scored = 0;
  for (size_t start = 0; start + body <= ids.size() && scored < max_tokens; start += body) {
    std::vector<int32_t> window = {m.config.bos_id >= 0 ? m.config.bos_id : 1};
    window.insert(window.end(), ids.begin() + start, ids.begin() + start + body);
    logits.resize(static_cast<size_t>(ctx) * vocab);
    tf.forward(window.data(), ctx, 0, logits.data(), true);
    for (int t = 0; t + 1 < ctx; ++t) {
      const float* l = logits.data() + static_cast<size_t>(t) * vocab;
      const double mx = *std::max_element(l, l + vocab);
      double z = 0;
      for (int v = 0; v < vocab; ++v) z += std::exp(static_cast<double>(l[v]) - mx);
      nll += std::log(z) + mx - l[window[t + 1]];
      ++scored;
    }
  }
  return {scored > 0 ? std::exp(nll / static_cast<double>(scored)) : 0.0, scored};
}

}  // namespace gyre::test
