// The host reference of token sampling: the one implementation of its semantics, used by
// engine/sampler.cc and by Backend::sample's default (the CPU backend). The CUDA kernels
// (cuda/sampling.cu) follow the same rules and are tested against this code.
//
// Order of operations for one row (SampleRequest):
//   1. penalties on the raw logits: repetition_penalty once per listed id (positive logits
//      divided, negative multiplied), then logit -= count * frequency + (count > 0) * presence;
//   2. temperature <= 0: greedy, the argmax of the penalized logits (ties to the lowest id);
//   3. logits / temperature, softmax over every finite logit (NaN and -inf are left out);
//   4. top_k: the k most likely ("more likely": larger logit, equal logits by lower id);
//   5. typical_p; 6. top_p: the smallest more-likely prefix with probability >= top_p;
//   7. min_p: keep p >= min_p * p_max. Each filter sees the distribution renormalized over what
//      the earlier ones kept and always keeps the most likely token;
//   8. the draw: walking the kept ids in ascending id order, the first whose cumulative
//      probability exceeds `uniform` (ascending id order, not most-likely-first, so that a GPU can
//      find it with one prefix scan and no sort).
// Log-probabilities are those of the raw logits (before penalties and temperature).
#pragma once
#include <vector>

#include "backend/backend.h"

namespace gyre::sampling {

// One token while filtering: tempered logit (for ordering) and probability.
struct Entry {
  int id;
  double logit;
  double prob;
};

// Buffers reused between rows: a vocabulary-sized allocation per token costs more than the
// filtering itself.
struct HostScratch {
  std::vector<float> logits;
  std::vector<Entry> set;
};

// Step 1 into `out` (a copy of the n logits).
void penalize(const float* logits, int n, const SampleRequest& r, std::vector<float>& out);
// Step 2 (throws gyre::Error when every logit is NaN).
int argmax_lowest_id(const float* logits, int n);
// Steps 3 to 7 on already penalized logits: the kept set, probabilities summing to 1, in no
// particular order. Throws gyre::Error when no logit is finite.
void filtered_set(const float* logits, int n, const SampleRequest& r, std::vector<Entry>& set);
// Most likely first (ties by lowest id).
void sort_more_likely(std::vector<Entry>& set);
// Steps 1 to 8 plus the log-probabilities asked for. Throws gyre::Error (see above).
SampleResult sample_row(const float* logits, int n, const SampleRequest& r, HostScratch& scratch);

}  // namespace gyre::sampling
