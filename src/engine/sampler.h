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
//   always keeps at least the most likely token. The draw is from the final renormalized set.
#pragma once
#include <cstdint>
#include <deque>
#include <random>
#include <vector>

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

namespace detail {
// One token while filtering: tempered logit (for ordering) and probability.
struct SamplerEntry {
  int id;
  double logit;
  double prob;
};
}  // namespace detail

struct Candidate {
  int id;
  float prob;
};

class Sampler {
 public:
  explicit Sampler(const SamplerSettings& s);

  // Picks a token from n_vocab logits. Does not record it: call accept() for that.
  int sample(const float* logits, int n_vocab);
  // Records a token (prompt or generated) for the penalties.
  void accept(int id);
  void reset_history() { history_.clear(); }

  // The set the draw would choose from, most likely first, with probabilities summing to 1
  // (one entry with probability 1 when greedy). Exposed for tests and diagnostics.
  std::vector<Candidate> candidates(const float* logits, int n_vocab) const;

  // The logits after step 1 (penalties).
  std::vector<float> penalized(const float* logits, int n_vocab) const;

  const SamplerSettings& settings() const { return s_; }

 private:
  double uniform();  // [0, 1), 53 random bits, the same on every platform
  void penalize_into(const float* logits, int n_vocab, std::vector<float>& out) const;

  SamplerSettings s_;
  std::mt19937_64 rng_;
  std::deque<int> history_;
  // Buffers reused between tokens: a vocabulary-sized allocation per token would cost more than
  // the filtering itself.
  std::vector<float> logits_buf_;
  std::vector<detail::SamplerEntry> set_buf_;
};

}  // namespace gyre
