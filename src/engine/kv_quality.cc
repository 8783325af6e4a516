#include "engine/kv_quality.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/transformer.h"

namespace gyre {

namespace {

// log-softmax of one row in double.
void log_softmax(const float* logits, int n, std::vector<double>& out) {
  out.resize(static_cast<size_t>(n));
  double mx = -INFINITY;
  for (int i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
  double z = 0;
  for (int i = 0; i < n; ++i) z += std::exp(logits[i] - mx);
  const double lz = mx + std::log(z);
  for (int i = 0; i < n; ++i) out[static_cast<size_t>(i)] = logits[i] - lz;
}

int argmax(const float* x, int n) {
  return static_cast<int>(std::max_element(x, x + n) - x);
}

struct Run {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Transformer> transformer;
  std::vector<float> logits;
  KvQualityResult result;
  double nll = 0, nll_f16 = 0, kl_sum = 0;
  int agree = 0;
};

}  // namespace

std::vector<KvQualityResult> compare_kv_caches(const LoadedModel& model,
                                               const std::vector<int>& tokens,
                                               const std::vector<std::string>& types,
                                               const std::string& device, int threads, int chunk) {
  GYRE_CHECK(tokens.size() >= 2, "compare_kv_caches needs at least 2 tokens");
  GYRE_CHECK(chunk > 0, "compare_kv_caches: chunk must be positive");
  const int n = static_cast<int>(tokens.size());
  const int vocab = model.config.vocab_size;
  auto make = [&](const std::string& type) {
    Run r;
    BackendOptions o;
    o.n_threads = threads;
    o.kv_cache = type;
    r.backend = backend_create(device, o);
    r.transformer = std::make_unique<Transformer>(model.config, model.weights, *r.backend, n);
    r.result.type = type;
    r.result.cache_bytes = r.transformer->cache_bytes();
    return r;
  };
  Run ref = make("f16");
  std::vector<Run> runs;
  for (const std::string& t : types) runs.push_back(make(t));

  std::vector<double> lp_ref, lp;
  for (int pos = 0; pos < n; pos += chunk) {
    const int m = std::min(chunk, n - pos);
    ref.logits.resize(static_cast<size_t>(m) * vocab);
    ref.transformer->forward(tokens.data() + pos, m, pos, ref.logits.data(), true);
    for (Run& r : runs) {
      r.logits.resize(ref.logits.size());
      r.transformer->forward(tokens.data() + pos, m, pos, r.logits.data(), true);
    }
    for (int i = 0; i < m; ++i) {
      const int p = pos + i;
      if (p + 1 >= n) break;  // the last token predicts nothing we have
      const float* lr = ref.logits.data() + static_cast<size_t>(i) * vocab;
      log_softmax(lr, vocab, lp_ref);
      const int next = tokens[static_cast<size_t>(p + 1)];
      for (Run& r : runs) {
        const float* lq = r.logits.data() + static_cast<size_t>(i) * vocab;
        log_softmax(lq, vocab, lp);
        double kl = 0;
        for (int v = 0; v < vocab; ++v)
          kl += std::exp(lp_ref[static_cast<size_t>(v)]) *
                (lp_ref[static_cast<size_t>(v)] - lp[static_cast<size_t>(v)]);
        kl = std::max(kl, 0.0);  // rounding can leave -1e-17
        r.kl_sum += kl;
        r.result.max_kl = std::max(r.result.max_kl, kl);
        r.agree += argmax(lr, vocab) == argmax(lq, vocab);
        r.nll -= lp[static_cast<size_t>(next)];
        r.nll_f16 -= lp_ref[static_cast<size_t>(next)];
      }
    }
  }
  std::vector<KvQualityResult> out;
  const int positions = n - 1;
  for (Run& r : runs) {
    r.result.positions = positions;
    r.result.mean_kl = r.kl_sum / positions;
    r.result.top1_agreement = static_cast<double>(r.agree) / positions;
    r.result.ppl = std::exp(r.nll / positions);
    r.result.ppl_f16 = std::exp(r.nll_f16 / positions);
    out.push_back(r.result);
  }
  return out;
}

}  // namespace gyre
