// Token sampling: penalties, temperature, truncation filters and a seeded draw.
//
// Order of operations in Sampler::sample (and Sampler::candidates):
//   1. penalties on the raw logits, over the last `penalty_window` accepted tokens:
//      repetition_penalty (once per distinct token: positive logits divided, negative
//      multiplied, as llama.cpp and Hugging Face do), then
//      logit -= count * frequency_penalty + (count > 0) * presence_penalty;
//   2. temperature <= 0: greedy, the argmax of the penalized logits (ties go to the lowest id);
//      the filters below are skipped;
//   3. logits / temperature, softmax over the whole vocabulary;
//   4. top_k (keep the k most likely; equal logits ordered by lowest id first);
//   5. typical_p (locally typical sampling: keep the tokens whose surprise -log p is closest to
//      the entropy, up to cumulative probability typical_p);
//   6. top_p (nucleus: the smallest most-likely prefix with cumulative probability >= top_p);
//   7. min_p (keep tokens with p >= min_p * p_max).
//   Each filter works on the distribution renormalized over what the earlier filters kept, and
//   always keeps at least the most likely token. The draw is from the final renormalized set,
//   walked in ascending id order with one uniform number from the seeded generator.
// The semantics live once, in backend/sample_host.h; a Sampler turns its settings and history
// into a SampleRequest (next_request) that any backend's sample op can serve.
#pragma once
#include <cstdint>
#include <deque>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/sample_host.h"

namespace gyre {

struct SamplerSettings {
  float temperature = 0.8f;         // 0 = greedy
  int top_k = 0;                    // 0 = off
  float top_p = 0.95f;              // 1 = off
  float min_p = 0.0f;               // 0 = off
  float typical_p = 1.0f;           // 1 = off
  float repetition_penalty = 1.0f;  // 1 = off
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  int penalty_window = 64;  // last N tokens the penalties look at; 0 = none, -1 = all
  uint64_t seed = 0;

  // Throws gyre::Error on a value out of range (negative temperature, top_p outside (0, 1], ...).
  void validate() const;
};

struct Candidate {
  int id;
  float prob;
};

class Sampler {
 public:
  explicit Sampler(const SamplerSettings& s);

  // Picks a token from n_vocab logits. Does not record it: call accept() for that.
  int sample(const float* logits, int n_vocab);
  // The request for the next token (penalty counts of the history; a uniform number drawn from
  // the seeded generator unless greedy, exactly as sample() would draw it). For Backend::sample.
  SampleRequest next_request();
  // Records a token (prompt or generated) for the penalties.
  void accept(int id);
  void reset_history() { history_.clear(); }

  // The set the draw would choose from, most likely first, with probabilities summing to 1
  // (one entry with probability 1 when greedy). Exposed for tests and diagnostics.
  std::vector<Candidate> candidates(const float* logits, int n_vocab) const;

  // The logits after step 1 (penalties).
  std::vector<float> penalized(const float* logits, int n_vocab) const;

  const SamplerSettings& settings() const { return s_; }
  // No penalties: a pick depends on the logits and the request's draw, not on the history (so
  // the backend may pick one step's token before the host has taken the last: decode_fed).
  bool no_penalties() const {
    return s_.repetition_penalty == 1.0f && s_.frequency_penalty == 0.0f &&
           s_.presence_penalty == 0.0f;
  }

 private:
  double uniform();  // [0, 1), 53 random bits, the same on every platform
  SampleRequest request_without_draw() const;

  SamplerSettings s_;
  std::mt19937_64 rng_;
  std::deque<int> history_;
  sampling::HostScratch scratch_;
};

}  // namespace gyre
