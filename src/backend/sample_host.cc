#include "backend/sample_host.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace gyre::sampling {

namespace {

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

void keep_typical(std::vector<Entry>& set, double typical_p) {
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
    if (cum >= typical_p) {
      keep = i + 1;
      break;
    }
  }
  set.resize(keep);
}

// log-softmax over the raw logits, in double: the chosen id's and the best ones'.
void add_logprobs(const float* logits, int n, const SampleRequest& r, SampleResult& out) {
  double max_logit = -INFINITY;
  for (int i = 0; i < n; ++i) max_logit = std::max<double>(max_logit, logits[i]);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i]) - max_logit);
  const double log_z = max_logit + std::log(sum);
  out.logprob = static_cast<float>(logits[out.id] - log_z);
  if (r.top_logprobs <= 0) return;
  std::vector<int> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = i;
  const int k = std::min(r.top_logprobs, n);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int a, int b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  for (int i = 0; i < k; ++i) {
    const int id = ids[static_cast<size_t>(i)];
    out.top_logprobs.emplace_back(id, static_cast<float>(logits[id] - log_z));
  }
}

}  // namespace

void penalize(const float* logits, int n, const SampleRequest& r, std::vector<float>& out) {
  out.assign(logits, logits + n);
  const bool any =
      r.repetition_penalty != 1.0f || r.frequency_penalty != 0.0f || r.presence_penalty != 0.0f;
  if (!any) return;
  for (const auto& [id, count] : r.penalty_counts) {
    if (id < 0 || id >= n || count <= 0) continue;
    float& l = out[static_cast<size_t>(id)];
    if (r.repetition_penalty != 1.0f)
      l = l > 0 ? l / r.repetition_penalty : l * r.repetition_penalty;
    l -= static_cast<float>(count) * r.frequency_penalty + r.presence_penalty;
  }
}

int argmax_lowest_id(const float* l, int n) {
  int best = -1;
  for (int i = 0; i < n; ++i)
    if (!std::isnan(l[i]) && (best < 0 || l[i] > l[best])) best = i;
  GYRE_CHECK(best >= 0, "every logit is NaN");
  return best;
}

void filtered_set(const float* logits, int n, const SampleRequest& r, std::vector<Entry>& set) {
  const double inv_t = 1.0 / static_cast<double>(r.temperature);
  set.clear();
  double max_l = -std::numeric_limits<double>::infinity();
  for (int i = 0; i < n; ++i) {
    const float l = logits[i];
    if (std::isnan(l) || l == -std::numeric_limits<float>::infinity()) continue;
    set.push_back({i, static_cast<double>(l) * inv_t, 0.0});
    max_l = std::max(max_l, set.back().logit);
  }
  GYRE_CHECK(!set.empty() && std::isfinite(max_l), "no finite logit to sample from");
  if (r.top_k > 0 && static_cast<size_t>(r.top_k) < set.size()) {
    std::partial_sort(set.begin(), set.begin() + r.top_k, set.end(), more_likely);
    set.resize(static_cast<size_t>(r.top_k));
  }
  for (Entry& e : set) e.prob = std::exp(e.logit - max_l);
  renormalize(set);
  if (r.typical_p < 1.0f && set.size() > 1) {
    keep_typical(set, r.typical_p);
    renormalize(set);
  }
  if (r.top_p < 1.0f && set.size() > 1) {
    keep_nucleus(set, r.top_p);
    renormalize(set);
  }
  if (r.min_p > 0.0f && set.size() > 1) {
    double p_max = 0.0;
    for (const Entry& e : set) p_max = std::max(p_max, e.prob);
    const double threshold = static_cast<double>(r.min_p) * p_max;
    std::erase_if(set, [threshold](const Entry& e) { return e.prob < threshold; });
    renormalize(set);
  }
}

void sort_more_likely(std::vector<Entry>& set) {
  std::sort(set.begin(), set.end(), more_likely);
}

SampleResult sample_row(const float* logits, int n, const SampleRequest& r, HostScratch& scratch) {
  GYRE_CHECK(n > 0, "empty vocabulary");
  penalize(logits, n, r, scratch.logits);
  SampleResult out;
  if (r.temperature <= 0.0f) {
    out.id = argmax_lowest_id(scratch.logits.data(), n);
  } else {
    std::vector<Entry>& set = scratch.set;
    filtered_set(scratch.logits.data(), n, r, set);
    auto by_id = [](const Entry& a, const Entry& b) { return a.id < b.id; };
    if (!std::is_sorted(set.begin(), set.end(), by_id)) std::sort(set.begin(), set.end(), by_id);
    double cum = 0.0;
    out.id = set.back().id;  // kept when u lands in the rounding gap just below 1
    for (const Entry& e : set) {
      cum += e.prob;
      if (r.uniform < cum) {
        out.id = e.id;
        break;
      }
    }
  }
  if (r.logprob || r.top_logprobs > 0) add_logprobs(logits, n, r, out);
  return out;
}

}  // namespace gyre::sampling
