// How much a quantized KV cache changes a model's predictions: the same tokens run through one
// Transformer per cache type (chunked prefill, so every position reads keys and values back from
// the cache), each position's next-token distribution compared with the f16 cache's.
// Used by the KvQuality measurement (tests/test_kv_quality.cc) and docs/kv_cache.md.
#pragma once
#include <string>
#include <vector>

#include "model/loader.h"

namespace gyre {

struct KvQualityResult {
  std::string type;             // "q8", "q4" (or "f16": compared with itself)
  int positions = 0;            // predictions compared (tokens - 1)
  double mean_kl = 0;           // mean over positions of KL(p_f16 || p_type), nats
  double max_kl = 0;            // largest per-position KL
  double top1_agreement = 0;    // fraction of positions with the same argmax
  double ppl_f16 = 0, ppl = 0;  // perplexity of tokens[1..] under each cache
  size_t cache_bytes = 0;       // this cache at the run's length
};

// tokens: at least 2. device: "cpu" (the reference) or a CUDA device. chunk: tokens per forward.
std::vector<KvQualityResult> compare_kv_caches(const LoadedModel& model,
                                               const std::vector<int>& tokens,
                                               const std::vector<std::string>& types,
                                               const std::string& device, int threads, int chunk);

}  // namespace gyre
