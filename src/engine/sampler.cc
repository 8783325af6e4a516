#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"

namespace gyre {

void SamplerSettings::validate() const {
  GYRE_CHECK(std::isfinite(temperature) && temperature >= 0, "temperature must be >= 0, got ",
             temperature);
  GYRE_CHECK(top_k >= 0, "top-k must be >= 0 (0 = off), got ", top_k);
  GYRE_CHECK(top_p > 0 && top_p <= 1, "top-p must be in (0, 1], got ", top_p);
  GYRE_CHECK(min_p >= 0 && min_p <= 1, "min-p must be in [0, 1], got ", min_p);
  GYRE_CHECK(typical_p > 0 && typical_p <= 1, "typical-p must be in (0, 1], got ", typical_p);
  GYRE_CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0,
             "repetition penalty must be > 0 (1 = off), got ", repetition_penalty);
  GYRE_CHECK(std::isfinite(frequency_penalty) && std::isfinite(presence_penalty),
             "frequency and presence penalties must be finite");
  GYRE_CHECK(penalty_window >= -1, "penalty window must be >= -1 (-1 = all), got ", penalty_window);
}

Sampler::Sampler(const SamplerSettings& s) : s_(s), rng_(s.seed) {
  s_.validate();
}

void Sampler::accept(int id) {
  if (s_.penalty_window == 0) return;
  history_.push_back(id);
  if (s_.penalty_window > 0 && history_.size() > static_cast<size_t>(s_.penalty_window))
    history_.pop_front();
}

SampleRequest Sampler::request_without_draw() const {
  SampleRequest r;
  r.temperature = s_.temperature;
  r.top_k = s_.top_k;
  r.top_p = s_.top_p;
  r.min_p = s_.min_p;
  r.typical_p = s_.typical_p;
  r.repetition_penalty = s_.repetition_penalty;
  r.frequency_penalty = s_.frequency_penalty;
  r.presence_penalty = s_.presence_penalty;
  const bool any =
      s_.repetition_penalty != 1.0f || s_.frequency_penalty != 0.0f || s_.presence_penalty != 0.0f;
  if (any && !history_.empty()) {
    std::map<int, int> counts;  // ordered: the request is the same for the same history
    for (int id : history_) ++counts[id];
    r.penalty_counts.assign(counts.begin(), counts.end());
  }
  return r;
}

SampleRequest Sampler::next_request() {
  SampleRequest r = request_without_draw();
  if (s_.temperature > 0.0f) r.uniform = uniform();
  return r;
}

std::vector<float> Sampler::penalized(const float* logits, int n_vocab) const {
  std::vector<float> out;
  sampling::penalize(logits, n_vocab, request_without_draw(), out);
  return out;
}

std::vector<Candidate> Sampler::candidates(const float* logits, int n_vocab) const {
  GYRE_CHECK(n_vocab > 0, "empty vocabulary");
  const std::vector<float> l = penalized(logits, n_vocab);
  if (s_.temperature <= 0.0f) return {{sampling::argmax_lowest_id(l.data(), n_vocab), 1.0f}};
  std::vector<sampling::Entry> set;
  sampling::filtered_set(l.data(), n_vocab, request_without_draw(), set);
  sampling::sort_more_likely(set);
  std::vector<Candidate> out;
  out.reserve(set.size());
  for (const sampling::Entry& e : set) out.push_back({e.id, static_cast<float>(e.prob)});
  return out;
}

double Sampler::uniform() {
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

int Sampler::sample(const float* logits, int n_vocab) {
  return sampling::sample_row(logits, n_vocab, next_request(), scratch_).id;
}

}  // namespace gyre
