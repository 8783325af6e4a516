// Backend::sample. Oracles: a naive float64 implementation of the documented semantics (full
// sort of the vocabulary, filters in order, draw in ascending id order) for the host reference;
// the host reference (on the same FP16-rounded logits) for the CUDA kernels; the host Sampler
// on downloaded logits for generation through the op. CUDA tests are skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/sample_host.h"
#include "core/half.h"
#include "engine/generator.h"
#include "engine/sampler.h"
#include "engine/transformer.h"
#include "model/loader.h"
#ifdef GYRE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

#include "cuda_test_util.h"

namespace gyre {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- naive float64 reference ----

struct NaiveSet {
  std::vector<int> ids;       // kept, ascending id
  std::vector<double> probs;  // matching ids, summing to 1
  double top_p_margin = 1.0;  // distance of the nucleus's cumulative sums to top_p
  double min_p_margin = 1.0;  // distance of the kept ratios to min_p
};

NaiveSet naive_set(const std::vector<float>& l, const SampleRequest& r) {
  std::vector<int> order;
  for (int i = 0; i < static_cast<int>(l.size()); ++i)
    if (!std::isnan(l[i]) && l[i] != -kInf) order.push_back(i);
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  const double t = r.temperature, top = l[order[0]];
  std::vector<double> w;
  for (int id : order) w.push_back(std::exp((static_cast<double>(l[id]) - top) / t));
  size_t keep = order.size();
  if (r.top_k > 0) keep = std::min(keep, static_cast<size_t>(r.top_k));
  NaiveSet out;
  if (r.top_p < 1.0f && keep > 1) {
    double z = 0, cum = 0;
    for (size_t j = 0; j < keep; ++j) z += w[j];
    for (size_t j = 0; j < keep; ++j) {
      cum += w[j] / z;
      out.top_p_margin = std::min(out.top_p_margin, std::abs(cum - r.top_p));
      if (cum >= r.top_p) {
        keep = j + 1;
        break;
      }
    }
  }
  if (r.min_p > 0.0f && keep > 1) {
    size_t n = 0;
    for (size_t j = 0; j < keep; ++j) {
      out.min_p_margin = std::min(out.min_p_margin, std::abs(w[j] - r.min_p));
      if (w[j] >= r.min_p) n = j + 1;  // w[0] = 1 = p_max in these units
    }
    keep = n;
  }
  std::vector<std::pair<int, double>> kept;
  double z = 0;
  for (size_t j = 0; j < keep; ++j) {
    kept.emplace_back(order[j], w[j]);
    z += w[j];
  }
  std::sort(kept.begin(), kept.end());
  for (auto& [id, p] : kept) {
    out.ids.push_back(id);
    out.probs.push_back(p / z);
  }
  return out;
}

// The naive draw and the distance of u to the nearest cumulative boundary.
int naive_draw(const NaiveSet& s, double u, double* margin) {
  double cum = 0;
  *margin = 1.0;
  int chosen = s.ids.back();
  bool found = false;
  for (size_t j = 0; j < s.ids.size(); ++j) {
    cum += s.probs[j];
    *margin = std::min(*margin, std::abs(cum - u));
    if (!found && u < cum) {
      chosen = s.ids[j];
      found = true;
    }
  }
  return chosen;
}

double naive_log_z(const std::vector<float>& l) {
  double m = -kInf, s = 0;
  for (float x : l) m = std::max<double>(m, x);
  for (float x : l) s += std::exp(static_cast<double>(x) - m);
  return m + std::log(s);
}

// Logits as a model makes them (normal, scale 3), rounded to FP16 so that host and GPU see the
// same values; `ties` rounds to steps of 0.25 (many equal logits), `specials` adds -inf entries.
std::vector<float> make_logits(int n, std::mt19937& g, bool ties, bool specials) {
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> l(static_cast<size_t>(n));
  for (float& x : l) {
    float v = d(g);
    if (ties) v = std::round(v * 4.0f) / 4.0f;
    x = f16_to_f32(f32_to_f16(v));
  }
  if (specials && n > 3)
    for (int k = 0; k < n / 50 + 1; ++k) l[g() % static_cast<uint32_t>(n - 1) + 1] = -kInf;
  return l;
}

std::vector<SampleRequest> settings_grid() {
  std::vector<SampleRequest> out;
  for (float t : {0.0f, 0.7f, 1.0f, 1.6f})
    for (int k : {0, 1, 5, 40})
      for (float p : {1.0f, 0.9f, 0.5f})
        for (float mp : {0.0f, 0.05f}) {
          if (t == 0.0f && (k != 0 || p != 1.0f || mp != 0.0f)) continue;
          SampleRequest r;
          r.temperature = t;
          r.top_k = k;
          r.top_p = p;
          r.min_p = mp;
          out.push_back(r);
        }
  return out;
}

TEST(SamplingOpHost, MatchesNaiveFloat64Reference) {
  std::mt19937 g(7);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  sampling::HostScratch scratch;
  int checked = 0;
  for (int n : {1, 7, 300, 5000})
    for (bool ties : {false, true}) {
      std::vector<float> l = make_logits(n, g, ties, true);
      const double log_z = naive_log_z(l);
      for (SampleRequest r : settings_grid()) {
        r.uniform = uni(g);
        r.logprob = true;
        r.top_logprobs = 5;
        const SampleResult got = sampling::sample_row(l.data(), n, r, scratch);
        if (r.temperature <= 0.0f) {
          EXPECT_EQ(got.id, std::max_element(l.begin(), l.end()) - l.begin());
        } else {
          const NaiveSet s = naive_set(l, r);
          double margin = 0;
          const int want = naive_draw(s, r.uniform, &margin);
          if (s.top_p_margin < 1e-9 || s.min_p_margin < 1e-9 || margin < 1e-9) continue;
          EXPECT_EQ(got.id, want) << "n " << n << " t " << r.temperature << " k " << r.top_k;
          std::vector<sampling::Entry> set;
          sampling::filtered_set(l.data(), n, r, set);
          std::sort(set.begin(), set.end(), [](auto& a, auto& b) { return a.id < b.id; });
          ASSERT_EQ(set.size(), s.ids.size());
          for (size_t j = 0; j < set.size(); ++j) {
            EXPECT_EQ(set[j].id, s.ids[j]);
            EXPECT_NEAR(set[j].prob, s.probs[j], 1e-9);
          }
        }
        EXPECT_NEAR(got.logprob, l[static_cast<size_t>(got.id)] - log_z, 1e-5);
        ASSERT_EQ(got.top_logprobs.size(), static_cast<size_t>(std::min(5, n)));
        std::vector<int> order(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
        for (size_t j = 0; j < got.top_logprobs.size(); ++j) {
          EXPECT_EQ(got.top_logprobs[j].first, order[j]);
          EXPECT_NEAR(got.top_logprobs[j].second, l[static_cast<size_t>(order[j])] - log_z, 1e-5);
        }
        ++checked;
      }
    }
  EXPECT_GT(checked, 100);
}

// A host tensor of the CPU backend holding `rows` rows of logits (upload_weight of F32 data).
Tensor upload_rows(Backend& b, const std::vector<float>& data, int rows, int cols) {
  TensorView t;
  t.name = "logits";
  t.dtype = DType::F32;
  t.shape = {rows, cols};
  t.data = data.data();
  t.nbytes = data.size() * sizeof(float);
  return b.upload_weight(t);
}

TEST(SamplingOpHost, DefaultOpEqualsSampler) {
  auto cpu = backend_create("cpu", 1);
  std::mt19937 g(11);
  const int n = 3000, rows = 4;
  std::vector<float> data;
  for (int r = 0; r < rows; ++r) {
    const std::vector<float> l = make_logits(n, g, r % 2 == 1, r == 3);
    data.insert(data.end(), l.begin(), l.end());
  }
  const Tensor t = upload_rows(*cpu, data, rows, n);
  SamplerSettings st;
  st.temperature = 0.9f;
  st.top_p = 0.9f;
  st.top_k = 50;
  st.min_p = 0.02f;
  st.repetition_penalty = 1.3f;
  st.frequency_penalty = 0.2f;
  st.seed = 99;
  Sampler via_op(st), direct(st);
  for (int step = 0; step < 20; ++step) {
    std::vector<SampleRequest> req;
    for (int r = 0; r < rows; ++r) req.push_back(via_op.next_request());
    std::vector<SampleResult> out(rows);
    cpu->sample(t, req.data(), rows, out.data());
    for (int r = 0; r < rows; ++r) {
      ASSERT_TRUE(out[static_cast<size_t>(r)].error.empty());
      const int want = direct.sample(data.data() + static_cast<size_t>(r) * n, n);
      EXPECT_EQ(out[static_cast<size_t>(r)].id, want) << "step " << step << " row " << r;
      via_op.accept(want);
      direct.accept(want);
    }
  }
  // A row with no finite logit fails alone.
  std::vector<float> bad(2 * 5, -kInf);
  bad[7] = 1.0f;
  const Tensor tb = upload_rows(*cpu, bad, 2, 5);
  SampleRequest r;
  r.temperature = 1.0f;
  std::vector<SampleRequest> req(2, r);
  std::vector<SampleResult> out(2);
  cpu->sample(tb, req.data(), 2, out.data());
  EXPECT_FALSE(out[0].error.empty());
  EXPECT_TRUE(out[1].error.empty());
  EXPECT_EQ(out[1].id, 2);
}

// ---- generation through the op vs the host Sampler on downloaded logits ----

std::vector<int> generate_via_host_logits(Transformer& t, const std::vector<int>& prompt,
                                          const SamplerSettings& st, int steps) {
  const int vocab = t.config().vocab_size;
  std::vector<float> logits(static_cast<size_t>(vocab));
  Sampler s(st);
  for (int id : prompt) s.accept(id);
  t.forward(prompt.data(), static_cast<int>(prompt.size()), 0, logits.data(), false);
  std::vector<int> out;
  int pos = static_cast<int>(prompt.size());
  for (int i = 0; i < steps; ++i) {
    const int id = s.sample(logits.data(), vocab);
    s.accept(id);
    out.push_back(id);
    t.forward(&id, 1, pos++, logits.data(), false);
  }
  return out;
}

void expect_generation_matches(Backend& backend, const char* what) {
  auto model = load_model(std::string(GYRE_FIXTURES) + "/stories260K");
  Transformer a(model->config, model->weights, backend, 256);
  Transformer b(model->config, model->weights, backend, 256);
  Generator gen(a, *model->tokenizer);
  const std::vector<int> prompt = model->tokenizer->encode("Once upon a time", true);
  for (float temperature : {0.0f, 0.8f}) {
    GenerationSettings s;
    s.max_tokens = 64;
    s.ignore_eos = true;
    s.sampler.temperature = temperature;
    s.sampler.top_p = 0.9f;
    s.sampler.seed = 5;
    const GenerationResult got = gen.generate_ids(prompt, s);
    EXPECT_EQ(got.tokens, generate_via_host_logits(b, prompt, s.sampler, 64))
        << what << " temperature " << temperature;
  }
}

TEST(SamplingOpHost, Stories260KGenerationMatchesHostSampler) {
  auto cpu = backend_create("cpu", 1);
  expect_generation_matches(*cpu, "cpu");
}

// ---- CUDA ----

// Is a GPU choice that differs from the host reference explained by rounding at a boundary?
bool near_boundary(const std::vector<float>& l, const SampleRequest& r, int gpu_id) {
  const NaiveSet s = naive_set(l, r);
  double margin = 0;
  naive_draw(s, r.uniform, &margin);
  const bool in_set = std::find(s.ids.begin(), s.ids.end(), gpu_id) != s.ids.end();
  return margin < 1e-4 || (!in_set && (s.top_p_margin < 1e-4 || s.min_p_margin < 1e-4));
}

// Within 1e-3, or both -inf (a -inf logit among the best of a tiny vocabulary).
void expect_logprob_near(float got, float want) {
  if (std::isinf(want) && want < 0) {
    EXPECT_TRUE(std::isinf(got) && got < 0) << got;
  } else {
    EXPECT_NEAR(got, want, 1e-3);
  }
}

struct CudaCase {
  int vocab;
  bool ties, specials;
};

TEST(SamplingOpCuda, MatchesHostReferenceOnAwkwardVocabularies) {
  GYRE_SKIP_WITHOUT_GPU();
  auto gpu = ctest::cuda_backend();
  std::mt19937 g(3);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  sampling::HostScratch scratch;
  constexpr int kRows = 16;  // one logits row, replicated, drawn at 16 points of [0, 1)
  int compared = 0, differing = 0;
  for (const CudaCase c :
       {CudaCase{1, false, false}, CudaCase{7, true, true}, CudaCase{32000, false, true},
        CudaCase{128256, true, false}, CudaCase{151936, false, false}}) {
    const std::vector<float> l = make_logits(c.vocab, g, c.ties, c.specials);
    std::vector<float> data;
    for (int r = 0; r < kRows; ++r) data.insert(data.end(), l.begin(), l.end());
    const Tensor t = upload_rows(*gpu, data, kRows, c.vocab);
    const double log_z = naive_log_z(l);
    for (const SampleRequest& base : settings_grid()) {
      std::vector<SampleRequest> req(kRows, base);
      for (int r = 0; r < kRows; ++r) {
        req[static_cast<size_t>(r)].uniform = (r + uni(g)) / kRows;
        req[static_cast<size_t>(r)].logprob = r % 2 == 0;
        req[static_cast<size_t>(r)].top_logprobs = r % 4 == 0 ? 20 : r % 4 == 1 ? 3 : 0;
      }
      std::vector<SampleResult> out(kRows);
      gpu->sample(t, req.data(), kRows, out.data());
      for (int r = 0; r < kRows; ++r) {
        const SampleRequest& q = req[static_cast<size_t>(r)];
        const SampleResult& o = out[static_cast<size_t>(r)];
        ASSERT_TRUE(o.error.empty()) << o.error;
        const SampleResult want = sampling::sample_row(l.data(), c.vocab, q, scratch);
        ++compared;
        if (q.temperature <= 0.0f) {
          ASSERT_EQ(o.id, want.id) << "greedy, vocab " << c.vocab;
        } else if (o.id != want.id) {
          ++differing;
          EXPECT_TRUE(near_boundary(l, q, o.id))
              << "vocab " << c.vocab << " t " << q.temperature << " k " << q.top_k << " p "
              << q.top_p << " min_p " << q.min_p << " u " << q.uniform << ": gpu " << o.id
              << " host " << want.id;
        }
        if (q.logprob) {
          EXPECT_NEAR(o.logprob, l[static_cast<size_t>(o.id)] - log_z, 1e-3);
        }
        ASSERT_EQ(o.top_logprobs.size(), want.top_logprobs.size());
        for (size_t j = 0; j < o.top_logprobs.size(); ++j) {
          EXPECT_EQ(o.top_logprobs[j].first, want.top_logprobs[j].first);
          expect_logprob_near(o.top_logprobs[j].second, want.top_logprobs[j].second);
        }
      }
    }
  }
  std::printf("compared %d draws, %d differ (all at a rounding boundary)\n", compared, differing);
  EXPECT_LE(differing * 100, compared);  // at most 1%
}

TEST(SamplingOpCuda, RandomSettingsOnSmallVocabularies) {
  GYRE_SKIP_WITHOUT_GPU();
  auto gpu = ctest::cuda_backend();
  std::mt19937 g(21);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  sampling::HostScratch scratch;
  int differing = 0, compared = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int vocab = std::vector<int>{1, 2, 3, 7, 100, 1000, 4099}[trial % 7];
    constexpr int kRows = 8;
    std::vector<float> data;
    std::vector<std::vector<float>> rows;
    std::vector<SampleRequest> req(kRows);
    for (int r = 0; r < kRows; ++r) {
      rows.push_back(make_logits(vocab, g, g() % 2 == 0, g() % 3 == 0));
      data.insert(data.end(), rows.back().begin(), rows.back().end());
      SampleRequest& q = req[static_cast<size_t>(r)];
      q.temperature = g() % 5 == 0 ? 0.0f : static_cast<float>(0.2 + 2 * uni(g));
      q.top_k = g() % 2 ? 0 : static_cast<int>(g() % 64);
      q.top_p = g() % 2 ? 1.0f : static_cast<float>(0.05 + 0.95 * uni(g));
      q.min_p = g() % 2 ? 0.0f : static_cast<float>(0.3 * uni(g));
      q.uniform = uni(g);
      q.logprob = true;
      q.top_logprobs = static_cast<int>(g() % 21);
    }
    const Tensor t = upload_rows(*gpu, data, kRows, vocab);
    std::vector<SampleResult> out(kRows);
    gpu->sample(t, req.data(), kRows, out.data());
    for (int r = 0; r < kRows; ++r) {
      const SampleRequest& q = req[static_cast<size_t>(r)];
      const std::vector<float>& l = rows[static_cast<size_t>(r)];
      const SampleResult want = sampling::sample_row(l.data(), vocab, q, scratch);
      const SampleResult& o = out[static_cast<size_t>(r)];
      ++compared;
      if (o.id != want.id) {
        ++differing;
        EXPECT_TRUE(q.temperature > 0.0f && near_boundary(l, q, o.id))
            << "vocab " << vocab << " t " << q.temperature << " k " << q.top_k << " p " << q.top_p
            << " min_p " << q.min_p << " u " << q.uniform << ": gpu " << o.id << " host "
            << want.id;
      }
      EXPECT_NEAR(o.logprob, l[static_cast<size_t>(o.id)] - naive_log_z(l), 1e-3);
      ASSERT_EQ(o.top_logprobs.size(), want.top_logprobs.size());
      for (size_t j = 0; j < o.top_logprobs.size(); ++j)
        EXPECT_EQ(o.top_logprobs[j].first, want.top_logprobs[j].first);
    }
  }
  EXPECT_LE(differing * 100, compared * 2);
}

TEST(SamplingOpCuda, Stories260KGenerationMatchesHostSampler) {
  GYRE_SKIP_WITHOUT_GPU();
  auto gpu = ctest::cuda_backend();
  expect_generation_matches(*gpu, "cuda");
}

TEST(SamplingOpCuda, PenaltyRowsGoToTheHostReference) {
  GYRE_SKIP_WITHOUT_GPU();
  auto gpu = ctest::cuda_backend();
  std::mt19937 g(5);
  const int vocab = 1000;
  const std::vector<float> l = make_logits(vocab, g, false, false);
  const Tensor t = upload_rows(*gpu, l, 1, vocab);
  SampleRequest q;
  q.temperature = 0.0f;
  q.repetition_penalty = 100.0f;
  const int best = static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin());
  q.penalty_counts = {{best, 1}};
  SampleResult o;
  gpu->sample(t, &q, 1, &o);
  sampling::HostScratch scratch;
  EXPECT_EQ(o.id, sampling::sample_row(l.data(), vocab, q, scratch).id);
  EXPECT_NE(o.id, best);
}

// Timing (not a check): the op on 1 and 32 rows of a 128256 vocabulary vs downloading the rows
// and sampling them on the host. Run with --gtest_also_run_disabled_tests.
TEST(SamplingOpCuda, DISABLED_Timing) {
  GYRE_SKIP_WITHOUT_GPU();
  auto gpu = ctest::cuda_backend();
  std::mt19937 g(9);
  const int vocab = 128256;
  using Clock = std::chrono::steady_clock;
  for (int rows : {1, 32}) {
    std::vector<float> data;
    for (int r = 0; r < rows; ++r) {
      const std::vector<float> l = make_logits(vocab, g, false, false);
      data.insert(data.end(), l.begin(), l.end());
    }
    const Tensor t = upload_rows(*gpu, data, rows, vocab);
    for (const char* name : {"greedy", "t0.8 top_p0.95", "t0.8 top_k40 top_p0.9 min_p0.05 lp5"}) {
      SampleRequest q;
      const std::string n = name;
      if (n != "greedy") {
        q.temperature = 0.8f;
        q.top_p = n.find("0.95") != std::string::npos ? 0.95f : 0.9f;
      }
      if (n.find("top_k") != std::string::npos) {
        q.top_k = 40;
        q.min_p = 0.05f;
        q.logprob = true;
        q.top_logprobs = 5;
      }
      std::vector<SampleRequest> req(static_cast<size_t>(rows), q);
      for (int r = 0; r < rows; ++r) req[static_cast<size_t>(r)].uniform = (r + 0.5) / rows;
      std::vector<SampleResult> out(static_cast<size_t>(rows));
      for (int w = 0; w < 3; ++w) gpu->sample(t, req.data(), rows, out.data());
      const int iters = 50;
      auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) gpu->sample(t, req.data(), rows, out.data());
      const double op_us =
          std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
      // The old path: rows to the host as floats, then the host reference.
      std::vector<float> host(data.size());
      sampling::HostScratch scratch;
      t0 = Clock::now();
      const int host_iters = rows == 1 ? 10 : 2;
      for (int i = 0; i < host_iters; ++i) {
        gpu->to_host(t, host.data());
        for (int r = 0; r < rows; ++r)
          sampling::sample_row(host.data() + static_cast<size_t>(r) * vocab, vocab,
                               req[static_cast<size_t>(r)], scratch);
      }
      const double host_us =
          std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / host_iters;
      std::printf("sample op, %2d rows x %d, %-38s: GPU op %8.1f us, to_host + host %9.1f us\n",
                  rows, vocab, name, op_us, host_us);
    }
  }
}

}  // namespace
}  // namespace gyre
