// Sampler tests against a naive float64 reference written here from the definitions
// (full sorts, no shortcuts), independent of the sampler's own code paths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "core/error.h"
#include "engine/sampler.h"

namespace gyre {
namespace {

struct RefSettings {
  double temperature = 1.0;
  int top_k = 0;
  double top_p = 1.0, min_p = 0.0, typical_p = 1.0;
  double rep = 1.0, freq = 0.0, pres = 0.0;
};

std::vector<double> ref_penalize(const std::vector<float>& logits, const std::vector<int>& history,
                                 const RefSettings& s) {
  std::vector<double> out(logits.begin(), logits.end());
  for (size_t id = 0; id < out.size(); ++id) {
    int count = 0;
    for (int h : history) count += h == static_cast<int>(id);
    if (count == 0) continue;
    if (out[id] > 0)
      out[id] /= s.rep;
    else
      out[id] *= s.rep;
    out[id] -= count * s.freq + s.pres;
  }
  return out;
}

// Returns id -> probability of the final set.
std::map<int, double> ref_distribution(const std::vector<double>& logits, const RefSettings& s) {
  std::vector<int> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>(i);
  auto by_logit = [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::sort(ids.begin(), ids.end(), by_logit);
  if (s.top_k > 0 && s.top_k < static_cast<int>(ids.size())) ids.resize(s.top_k);
  auto probs_of = [&](const std::vector<int>& set) {
    std::map<int, double> p;
    double z = 0;
    for (int i : set) z += std::exp(logits[i] / s.temperature);
    for (int i : set) p[i] = std::exp(logits[i] / s.temperature) / z;
    return p;
  };
  auto prefix_until = [](const std::vector<int>& order, const std::map<int, double>& p,
                         double mass) {
    std::vector<int> kept;
    double cum = 0;
    for (int i : order) {
      kept.push_back(i);
      cum += p.at(i);
      if (cum >= mass) break;
    }
    return kept;
  };
  if (s.typical_p < 1.0) {
    auto p = probs_of(ids);
    double h = 0;
    for (auto& [i, q] : p) h -= q * std::log(q);
    std::vector<int> order = ids;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return std::abs(-std::log(p[a]) - h) < std::abs(-std::log(p[b]) - h);
    });
    ids = prefix_until(order, p, s.typical_p);
    std::sort(ids.begin(), ids.end(), by_logit);
  }
  if (s.top_p < 1.0) ids = prefix_until(ids, probs_of(ids), s.top_p);
  if (s.min_p > 0.0) {
    auto p = probs_of(ids);
    const double pmax = p.at(ids[0]);
    std::vector<int> kept;
    for (int i : ids)
      if (p[i] >= s.min_p * pmax) kept.push_back(i);
    ids = kept;
  }
  return probs_of(ids);
}

std::vector<float> random_logits(int n, uint32_t seed, float scale = 3.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> l(n);
  for (float& x : l) x = d(g);
  return l;
}

SamplerSettings to_settings(const RefSettings& r) {
  SamplerSettings s;
  s.temperature = static_cast<float>(r.temperature);
  s.top_k = r.top_k;
  s.top_p = static_cast<float>(r.top_p);
  s.min_p = static_cast<float>(r.min_p);
  s.typical_p = static_cast<float>(r.typical_p);
  s.repetition_penalty = static_cast<float>(r.rep);
  s.frequency_penalty = static_cast<float>(r.freq);
  s.presence_penalty = static_cast<float>(r.pres);
  s.penalty_window = -1;
  return s;
}

// The reference sees the settings as the sampler does: rounded to float.
RefSettings as_float(RefSettings r) {
  for (double* v : {&r.temperature, &r.top_p, &r.min_p, &r.typical_p, &r.rep, &r.freq, &r.pres})
    *v = static_cast<float>(*v);
  return r;
}

void expect_same_set(RefSettings r, const std::vector<float>& logits,
                     const std::vector<int>& history = {}) {
  r = as_float(r);
  Sampler sampler(to_settings(r));
  for (int h : history) sampler.accept(h);
  const auto got = sampler.candidates(logits.data(), static_cast<int>(logits.size()));
  const auto want = ref_distribution(ref_penalize(logits, history, r), r);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(want.count(got[i].id)) << "unexpected id " << got[i].id;
    EXPECT_NEAR(got[i].prob, want.at(got[i].id), 1e-6);
    if (i > 0) {
      EXPECT_GE(got[i - 1].prob, got[i].prob);
    }
  }
}

TEST(SamplerFilters, NoFilterIsSoftmax) {
  expect_same_set({.temperature = 0.7}, random_logits(40, 1));
}

TEST(SamplerFilters, TopK) {
  for (int k : {1, 3, 17, 40, 100}) expect_same_set({.top_k = k}, random_logits(40, 2));
}

TEST(SamplerFilters, TopKTiesKeepLowestIds) {
  std::vector<float> l = {1, 5, 5, 5, 0, 5};
  expect_same_set({.top_k = 2}, l);
  Sampler s(to_settings({.top_k = 2}));
  auto c = s.candidates(l.data(), 6);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(std::min(c[0].id, c[1].id), 1);
  EXPECT_EQ(std::max(c[0].id, c[1].id), 2);
}

TEST(SamplerFilters, TopP) {
  for (double p : {0.05, 0.3, 0.5, 0.9, 0.99})
    for (uint32_t seed : {3u, 4u}) expect_same_set({.top_p = p}, random_logits(300, seed));
}

TEST(SamplerFilters, TopPLargeVocabulary) {
  // Flat logits: the nucleus needs many tokens, exercising the growing partial sort.
  expect_same_set({.top_p = 0.9}, random_logits(5000, 5, 0.5f));
}

TEST(SamplerFilters, TopPWideLogitRange) {
  // Gaps of up to 100 nats between logits: tiny probabilities, ties, and a nucleus boundary deep
  // in the tail.
  std::vector<float> l(200);
  for (size_t i = 0; i < l.size(); ++i) l[i] = -0.25f * static_cast<float>(i / 2);
  for (double p : {0.5, 0.999, 0.9999999}) expect_same_set({.top_p = p}, l);
}

TEST(SamplerFilters, MinP) {
  for (double m : {0.01, 0.1, 0.5, 1.0}) expect_same_set({.min_p = m}, random_logits(60, 6));
}

TEST(SamplerFilters, TypicalP) {
  for (double t : {0.2, 0.5, 0.95}) expect_same_set({.typical_p = t}, random_logits(60, 7));
}

TEST(SamplerFilters, Combined) {
  expect_same_set({.temperature = 1.3, .top_k = 30, .top_p = 0.8, .min_p = 0.05, .typical_p = 0.9},
                  random_logits(200, 8));
  expect_same_set({.temperature = 0.5, .top_k = 10, .top_p = 0.95}, random_logits(200, 9));
}

TEST(SamplerPenalties, MatchReference) {
  const std::vector<float> logits = random_logits(30, 10);
  const std::vector<int> history = {1, 2, 2, 5, 7, 7, 7, 29};
  RefSettings r{.rep = 1.3, .freq = 0.4, .pres = 0.25};
  Sampler s(to_settings(r));
  for (int h : history) s.accept(h);
  const auto got = s.penalized(logits.data(), 30);
  const auto want = ref_penalize(logits, history, r);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << i;
  expect_same_set(r, logits, history);
}

TEST(SamplerPenalties, SignConvention) {
  // Positive logits shrink towards 0, negative ones move away from 0: both less likely.
  const std::vector<float> logits = {2.0f, -2.0f, 1.0f};
  SamplerSettings st;
  st.repetition_penalty = 2.0f;
  Sampler s(st);
  s.accept(0);
  s.accept(1);
  const auto got = s.penalized(logits.data(), 3);
  const auto want = ref_penalize(logits, {0, 1}, {.rep = 2.0});
  for (int i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(got[i], want[i]);
  EXPECT_LT(got[0], logits[0]);
  EXPECT_LT(got[1], logits[1]);
}

TEST(SamplerPenalties, WindowForgetsOldTokens) {
  const std::vector<float> logits = random_logits(10, 11);
  SamplerSettings st;
  st.presence_penalty = 1.0f;
  st.penalty_window = 2;
  Sampler s(st);
  for (int h : {3, 4, 5}) s.accept(h);  // 3 falls out of the window
  const auto got = s.penalized(logits.data(), 10);
  const auto want = ref_penalize(logits, {4, 5}, {.pres = 1.0});
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6);
}

TEST(SamplerGreedy, ArgmaxTiesToLowestId) {
  SamplerSettings st;
  st.temperature = 0.0f;
  Sampler s(st);
  const std::vector<float> l = {0.5f, 3.0f, -1.0f, 3.0f, 3.0f};
  EXPECT_EQ(s.sample(l.data(), 5), 1);
  const auto c = s.candidates(l.data(), 5);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].id, 1);
  for (uint32_t seed = 20; seed < 30; ++seed) {
    auto r = random_logits(100, seed);
    EXPECT_EQ(s.sample(r.data(), 100), std::max_element(r.begin(), r.end()) - r.begin());
  }
}

TEST(SamplerGreedy, PenaltiesApplyBeforeArgmax) {
  SamplerSettings st;
  st.temperature = 0.0f;
  st.repetition_penalty = 4.0f;
  Sampler s(st);
  s.accept(0);
  const std::vector<float> l = {3.0f, 1.0f};  // 3 / 4 < 1
  EXPECT_EQ(s.sample(l.data(), 2), 1);
}

// Pearson chi-square of n draws against the reference probabilities; the bound is the mean plus
// about 7 standard deviations (df + 7 sqrt(2 df)), so a correct sampler essentially never fails,
// while a wrong distribution with this many draws lands far above.
void expect_distribution(RefSettings r, const std::vector<float>& logits, int draws) {
  r = as_float(r);
  SamplerSettings st = to_settings(r);
  st.seed = 1234;
  Sampler s(st);
  std::map<int, int> counts;
  for (int i = 0; i < draws; ++i)
    ++counts[s.sample(logits.data(), static_cast<int>(logits.size()))];
  const auto want = ref_distribution(ref_penalize(logits, {}, r), r);
  for (auto& [id, c] : counts) ASSERT_TRUE(want.count(id)) << "drew a filtered-out id " << id;
  double chi2 = 0;
  for (auto& [id, p] : want) {
    const double expected = p * draws;
    const double diff = counts[id] - expected;
    chi2 += diff * diff / expected;
  }
  const double df = static_cast<double>(want.size()) - 1;
  EXPECT_LT(chi2, df + 7 * std::sqrt(2 * std::max(df, 1.0))) << "df " << df;
}

TEST(SamplerDistribution, MatchesReferenceProbabilities) {
  const auto l = random_logits(12, 12, 1.0f);
  expect_distribution({.temperature = 1.0}, l, 60000);
  expect_distribution({.temperature = 0.6, .top_k = 6}, l, 60000);
  expect_distribution({.temperature = 1.5, .top_p = 0.7}, l, 60000);
  expect_distribution({.min_p = 0.3}, l, 60000);
}

TEST(SamplerSeed, Reproducible) {
  const auto l = random_logits(50, 13, 1.0f);
  SamplerSettings st;
  st.temperature = 1.0f;
  st.top_p = 1.0f;
  st.seed = 42;
  Sampler a(st), b(st);
  st.seed = 43;
  Sampler c(st);
  std::vector<int> da, db, dc;
  for (int i = 0; i < 200; ++i) {
    da.push_back(a.sample(l.data(), 50));
    db.push_back(b.sample(l.data(), 50));
    dc.push_back(c.sample(l.data(), 50));
  }
  EXPECT_EQ(da, db);
  EXPECT_NE(da, dc);
}

TEST(SamplerSettingsCheck, RejectsBadValues) {
  auto bad = [](auto edit) {
    SamplerSettings s;
    edit(s);
    EXPECT_THROW(s.validate(), Error);
  };
  bad([](SamplerSettings& s) { s.temperature = -1; });
  bad([](SamplerSettings& s) { s.top_p = 0; });
  bad([](SamplerSettings& s) { s.top_p = 1.5f; });
  bad([](SamplerSettings& s) { s.top_k = -2; });
  bad([](SamplerSettings& s) { s.min_p = 2; });
  bad([](SamplerSettings& s) { s.typical_p = 0; });
  bad([](SamplerSettings& s) { s.repetition_penalty = 0; });
  bad([](SamplerSettings& s) { s.penalty_window = -5; });
  SamplerSettings ok;
  EXPECT_NO_THROW(ok.validate());
}

}  // namespace
}  // namespace gyre
