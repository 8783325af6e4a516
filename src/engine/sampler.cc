#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "core/error.h"

namespace gyre {

namespace {

using Entry = detail::SamplerEntry;

// Most likely first; equal logits by lowest id, so results never depend on sort stability.
// A function object (not a function pointer) so the sorts inline the comparison.
constexpr struct {
  bool operator()(const Entry& a, const Entry& b) const {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  }
} more_likely;

void renormalize(std::vector<Entry>& set) {
  double sum = 0.0;
  for (const Entry& e : set) sum += e.prob;
  for (Entry& e : set) e.prob /= sum;
}

// Keeps the smallest most-likely prefix whose probability reaches p, without sorting the
// vocabulary: entries are bucketed by how far their logit lies below the best one (buckets are
// ordered like more_likely), the bucket where the cumulative probability crosses p is found, and
// only that bucket is sorted (ties to the lowest id through more_likely).
void keep_nucleus(std::vector<Entry>& set, double p) {
  constexpr int kBuckets = 2048;
  constexpr double kSpan = 40.0;  // logit gaps beyond this (p ratio < 4e-18) share the last one
  double max_l = set[0].logit;
  for (const Entry& e : set) max_l = std::max(max_l, e.logit);
  auto bucket_of = [max_l](const Entry& e) {
    const double b = (max_l - e.logit) * (kBuckets / kSpan);
    return b >= kBuckets - 1 ? kBuckets - 1 : static_cast<int>(b);
  };
  std::vector<double> mass(kBuckets, 0.0);
  for (const Entry& e : set) mass[static_cast<size_t>(bucket_of(e))] += e.prob;
  int cross = kBuckets - 1;
  double before = 0.0;  // probability of the buckets before `cross`
  for (int b = 0; b < kBuckets; ++b) {
    if (before + mass[static_cast<size_t>(b)] >= p) {
      cross = b;
      break;
    }
    if (b < kBuckets - 1) before += mass[static_cast<size_t>(b)];
  }
  const auto boundary =
      std::partition(set.begin(), set.end(), [&](const Entry& e) { return bucket_of(e) < cross; });
  const auto rest =
      std::partition(boundary, set.end(), [&](const Entry& e) { return bucket_of(e) == cross; });
  std::sort(boundary, rest, more_likely);
  double cum = before;
  auto end = boundary;
  while (end != rest) {
    cum += end->prob;
    ++end;
    if (cum >= p) break;
  }
  set.erase(end, set.end());
}

}  // namespace

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

std::vector<float> Sampler::penalized(const float* logits, int n_vocab) const {
  std::vector<float> out;
  penalize_into(logits, n_vocab, out);
  return out;
}

void Sampler::penalize_into(const float* logits, int n_vocab, std::vector<float>& out) const {
  out.assign(logits, logits + n_vocab);
  const bool any =
      s_.repetition_penalty != 1.0f || s_.frequency_penalty != 0.0f || s_.presence_penalty != 0.0f;
  if (!any || history_.empty()) return;
  std::unordered_map<int, int> counts;
  for (int id : history_)
    if (id >= 0 && id < n_vocab) ++counts[id];
  for (const auto& [id, count] : counts) {
    float& l = out[static_cast<size_t>(id)];
    if (s_.repetition_penalty != 1.0f)
      l = l > 0 ? l / s_.repetition_penalty : l * s_.repetition_penalty;
    l -= static_cast<float>(count) * s_.frequency_penalty + s_.presence_penalty;
  }
}

namespace {

int argmax_lowest_id(const std::vector<float>& l) {
  int best = -1;
  for (size_t i = 0; i < l.size(); ++i)
    if (!std::isnan(l[i]) && (best < 0 || l[i] > l[static_cast<size_t>(best)]))
      best = static_cast<int>(i);
  GYRE_CHECK(best >= 0, "every logit is NaN");
  return best;
}

// Steps 3 to 7 of the header: the final set, probabilities summing to 1, in no particular order.
// `set` is the caller's buffer, reused between tokens (a vocabulary-sized allocation per token
// costs more than the filtering).
void filtered_set(const std::vector<float>& logits, const SamplerSettings& s,
                  std::vector<Entry>& set) {
  const double inv_t = 1.0 / static_cast<double>(s.temperature);
  set.clear();
  double max_l = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) {
    const float l = logits[i];
    if (std::isnan(l) || l == -std::numeric_limits<float>::infinity()) continue;
    set.push_back({static_cast<int>(i), static_cast<double>(l) * inv_t, 0.0});
    max_l = std::max(max_l, set.back().logit);
  }
  GYRE_CHECK(!set.empty() && std::isfinite(max_l), "no finite logit to sample from");
  if (s.top_k > 0 && static_cast<size_t>(s.top_k) < set.size()) {
    std::partial_sort(set.begin(), set.begin() + s.top_k, set.end(), more_likely);
    set.resize(static_cast<size_t>(s.top_k));
  }
  for (Entry& e : set) e.prob = std::exp(e.logit - max_l);
  renormalize(set);

  if (s.typical_p < 1.0f && set.size() > 1) {
    double entropy = 0.0;
    for (const Entry& e : set)
      if (e.prob > 0) entropy -= e.prob * std::log(e.prob);
    auto distance = [entropy](const Entry& e) {
      return e.prob > 0 ? std::abs(-std::log(e.prob) - entropy)
                        : std::numeric_limits<double>::infinity();
    };
    std::sort(set.begin(), set.end(), [&](const Entry& a, const Entry& b) {
      const double da = distance(a), db = distance(b);
      return da < db || (da == db && more_likely(a, b));
    });
    double cum = 0.0;
    size_t keep = set.size();
    for (size_t i = 0; i < set.size(); ++i) {
      cum += set[i].prob;
      if (cum >= s.typical_p) {
        keep = i + 1;
        break;
      }
    }
    set.resize(keep);
    renormalize(set);
  }
  if (s.top_p < 1.0f && set.size() > 1) {
    keep_nucleus(set, s.top_p);
    renormalize(set);
  }
  if (s.min_p > 0.0f && set.size() > 1) {
    double p_max = 0.0;
    for (const Entry& e : set) p_max = std::max(p_max, e.prob);
    const double threshold = static_cast<double>(s.min_p) * p_max;
    std::erase_if(set, [threshold](const Entry& e) { return e.prob < threshold; });
    renormalize(set);
  }
}

}  // namespace

std::vector<Candidate> Sampler::candidates(const float* logits, int n_vocab) const {
  GYRE_CHECK(n_vocab > 0, "empty vocabulary");
  const std::vector<float> l = penalized(logits, n_vocab);
  if (s_.temperature <= 0.0f) return {{argmax_lowest_id(l), 1.0f}};
  std::vector<Entry> set;
  filtered_set(l, s_, set);
  std::sort(set.begin(), set.end(), more_likely);
  std::vector<Candidate> out;
  out.reserve(set.size());
  for (const Entry& e : set) out.push_back({e.id, static_cast<float>(e.prob)});
  return out;
}

double Sampler::uniform() {
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

int Sampler::sample(const float* logits, int n_vocab) {
  GYRE_CHECK(n_vocab > 0, "empty vocabulary");
  penalize_into(logits, n_vocab, logits_buf_);
  if (s_.temperature <= 0.0f) return argmax_lowest_id(logits_buf_);
  std::vector<Entry>& set = set_buf_;
  filtered_set(logits_buf_, s_, set);
  const double u = uniform();
  double cum = 0.0;
  for (const Entry& e : set) {
    cum += e.prob;
    if (u < cum) return e.id;
  }
  return set.back().id;  // u landed in the rounding gap just below 1
}

}  // namespace gyre
