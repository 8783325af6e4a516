// Perplexity and KL divergence (engine/eval.h). Oracles: llama.cpp's chunking written out
// independently here, a naive long-double recomputation of the scores from the model's logits,
// and the reference perplexity published with gyre-ref-25M (measured with PyTorch).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "engine/eval.h"
#include "engine/transformer.h"
#include "model/loader.h"

namespace gyre {
namespace {

const std::string kFixtures = GYRE_FIXTURES;

std::vector<int> iota_tokens(int n) {
  std::vector<int> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = 100 + i;
  return t;
}

TEST(Eval, SecondHalfWindowsAreLlamaCppChunks) {
  const int bos = 1, ctx = 8;
  const std::vector<int> t = iota_tokens(30);
  EvalOptions o;
  o.ctx = ctx;
  const auto w = make_eval_windows(t, bos, o);
  // llama.cpp: tokens with BOS, n_chunk = n / n_ctx chunks of n_ctx, each chunk's first token
  // replaced by BOS, logits [n_ctx/2, n_ctx - 1) predict the next token.
  std::vector<int> with_bos = {bos};
  with_bos.insert(with_bos.end(), t.begin(), t.end());
  const size_t chunks = with_bos.size() / ctx;
  ASSERT_EQ(w.size(), chunks);
  for (size_t i = 0; i < chunks; ++i) {
    std::vector<int32_t> chunk(with_bos.begin() + static_cast<long>(i * ctx),
                               with_bos.begin() + static_cast<long>((i + 1) * ctx));
    chunk[0] = bos;
    EXPECT_EQ(w[i].tokens, chunk);
    EXPECT_EQ(w[i].first_target, ctx / 2 + 1);
  }
}

// Absolute token indices scored by the windows (each window's segment starts at a known index).
TEST(Eval, EveryTokenIsScoredOnceWithTheRulesContext) {
  const std::vector<int> t = iota_tokens(50);
  for (bool all : {false, true}) {
    for (int stride : {0, 1, 3, 7}) {
      EvalOptions o;
      o.ctx = 8;
      o.stride = stride;
      o.score_all = all;
      const auto w = make_eval_windows(t, 1, o);
      std::multiset<int> scored;
      for (const auto& win : w) {
        for (size_t p = static_cast<size_t>(win.first_target); p < win.tokens.size(); ++p) {
          scored.insert(win.tokens[p]);
          if (!all) {
            EXPECT_GE(p, 5u);  // context of more than ctx/2 positions
          }
        }
      }
      SCOPED_TRACE(testing::Message() << "all " << all << " stride " << stride);
      for (int v : scored) EXPECT_EQ(scored.count(v), 1u) << v;
      if (all) {
        EXPECT_EQ(scored.size(), t.size());  // from the first token to the last
      } else if (stride > 0 && stride < o.ctx / 2) {
        EXPECT_EQ(*scored.begin(), 104);  // window 0's second half onwards, contiguous
        EXPECT_EQ(static_cast<int>(scored.size()), *scored.rbegin() - 104 + 1);
      }
    }
  }
  EvalOptions o;
  o.ctx = 64;
  EXPECT_THROW(make_eval_windows(t, 1, o), Error);  // too short for one whole window
  o.ctx = 8;
  o.stride = 9;
  EXPECT_THROW(make_eval_windows(t, 1, o), Error);
  o.stride = 0;
  o.max_windows = 2;
  EXPECT_EQ(make_eval_windows(t, 1, o).size(), 2u);
}

struct Stories {
  std::unique_ptr<LoadedModel> model;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Transformer> t;
  std::string text;
};

Stories& stories() {
  static Stories* s = [] {
    auto* st = new Stories;
    st->model = load_model(kFixtures + "/stories260K");
    st->backend = make_cpu_backend(2);
    st->t = std::make_unique<Transformer>(st->model->config, st->model->weights, *st->backend, 512);
    st->text = read_text_file(kFixtures + "/text/tinystories-sample.txt");
    return st;
  }();
  return *s;
}

long double naive_nll(const float* logits, int vocab, int target) {
  long double z = 0;
  for (int i = 0; i < vocab; ++i) z += std::exp(static_cast<long double>(logits[i]));
  return std::log(z) - static_cast<long double>(logits[target]);
}

TEST(Eval, Stories260KPerplexityEqualsANaiveRecomputation) {
  Stories& s = stories();
  const int vocab = s.model->config.vocab_size;
  const std::vector<int> ids = s.model->tokenizer->encode(s.text, false);
  for (bool all : {false, true}) {
    EvalOptions o;
    o.ctx = 256;
    o.score_all = all;
    o.max_windows = 6;  // about 1,500 tokens per rule: enough, and fast
    const auto windows = make_eval_windows(ids, s.model->tokenizer->bos_id(), o);
    const NllStats st = evaluate_perplexity(windows, vocab, transformer_logits(*s.t));
    // The naive sum: every scored target from its window's logits, in long double.
    long double sum = 0, sum_sq = 0;
    int64_t count = 0;
    std::vector<float> logits;
    for (const auto& w : windows) {
      logits.resize(w.tokens.size() * static_cast<size_t>(vocab));
      s.t->forward(w.tokens.data(), static_cast<int>(w.tokens.size()), 0, logits.data(), true);
      for (size_t p = static_cast<size_t>(w.first_target); p < w.tokens.size(); ++p) {
        const long double nll = naive_nll(&logits[(p - 1) * vocab], vocab, w.tokens[p]);
        sum += nll;
        sum_sq += nll * nll;
        ++count;
      }
    }
    const long double mean = sum / count;
    const long double sd = std::sqrt((sum_sq / count - mean * mean) / (count - 1));
    EXPECT_EQ(st.count, count);
    EXPECT_NEAR(st.ppl(), std::exp(static_cast<double>(mean)), 1e-9 * st.ppl());
    EXPECT_NEAR(st.ppl_stderr(), st.ppl() * static_cast<double>(sd), 1e-6 * st.ppl_stderr());
    // llama2.c reports validation loss 1.2968 (PPL 3.66) for this model on TinyStories; this
    // sample's split is unknown, so only the neighbourhood is checked.
    EXPECT_GT(st.ppl(), 2.5);
    EXPECT_LT(st.ppl(), 8.0);
    std::printf("stories260K on tinystories-sample, ctx 256 (%s): ppl %.4f +/- %.4f, %lld tokens\n",
                all ? "all" : "second half", st.ppl(), st.ppl_stderr(),
                static_cast<long long>(st.count));
  }
}

TEST(Eval, KldAgainstAPerturbedModelEqualsANaiveComputation) {
  Stories& s = stories();
  const int vocab = s.model->config.vocab_size;
  EvalOptions o;
  o.ctx = 128;
  o.max_windows = 3;
  const auto windows = make_eval_windows(*s.model->tokenizer, s.text, o);
  const WindowLogits ref = transformer_logits(*s.t);
  // A "quantized" model: the reference's logits with a deterministic wobble.
  const WindowLogits model = [&](const std::vector<int32_t>& tokens, float* logits) {
    ref(tokens, logits);
    for (size_t i = 0; i < tokens.size() * static_cast<size_t>(vocab); ++i)
      logits[i] += 0.7f * static_cast<float>(std::sin(0.37 * static_cast<double>(i % 977)));
  };
  const KldResult r = evaluate_kld(windows, vocab, ref, model);
  std::vector<long double> kl, dnll;  // dnll: model NLL - reference NLL of the target
  int64_t agree = 0;
  std::vector<float> a, b;
  for (const auto& w : windows) {
    a.resize(w.tokens.size() * static_cast<size_t>(vocab));
    b.resize(a.size());
    ref(w.tokens, a.data());
    model(w.tokens, b.data());
    for (size_t p = static_cast<size_t>(w.first_target); p < w.tokens.size(); ++p) {
      const float* x = &a[(p - 1) * vocab];
      const float* y = &b[(p - 1) * vocab];
      long double zx = 0, zy = 0;
      for (int i = 0; i < vocab; ++i) {
        zx += std::exp(static_cast<long double>(x[i]));
        zy += std::exp(static_cast<long double>(y[i]));
      }
      long double d = 0;
      for (int i = 0; i < vocab; ++i) {
        const long double px = std::exp(static_cast<long double>(x[i])) / zx;
        const long double py = std::exp(static_cast<long double>(y[i])) / zy;
        d += px * std::log(px / py);
      }
      kl.push_back(d);
      const int target = w.tokens[p];
      dnll.push_back(std::log(zy) - static_cast<long double>(y[target]) - std::log(zx) +
                     static_cast<long double>(x[target]));
      agree += std::max_element(x, x + vocab) - x == std::max_element(y, y + vocab) - y;
    }
  }
  ASSERT_EQ(r.kld.size(), kl.size());
  long double mean = 0;
  for (size_t i = 0; i < kl.size(); ++i) {
    EXPECT_NEAR(r.kld[i], static_cast<double>(kl[i]), 1e-9);
    mean += kl[i];
  }
  mean /= kl.size();
  EXPECT_NEAR(r.mean(), static_cast<double>(mean), 1e-10);
  EXPECT_GT(r.mean(), 0.01);
  EXPECT_EQ(r.top1_agree, agree);
  std::sort(kl.begin(), kl.end());
  EXPECT_NEAR(r.percentile(100), static_cast<double>(kl.back()), 1e-9);
  EXPECT_NEAR(r.percentile(0), static_cast<double>(kl.front()), 1e-9);
  // Nearest rank: the 90th percentile of N values is the ceil(0.9 N)-th smallest.
  const size_t rank = static_cast<size_t>(std::ceil(0.9 * static_cast<double>(kl.size())));
  EXPECT_NEAR(r.percentile(90), static_cast<double>(kl[rank - 1]), 1e-9);

  // The paired NLL difference: its mean is ln(ppl ratio); its standard error (tokens taken as
  // independent) is the sample standard deviation over sqrt(N).
  long double dm = 0, dss = 0;
  for (long double v : dnll) dm += v;
  dm /= dnll.size();
  for (long double v : dnll) dss += (v - dm) * (v - dm);
  const double dse = static_cast<double>(std::sqrt(dss / (dnll.size() - 1) / dnll.size()));
  ASSERT_EQ(r.delta.count, static_cast<int64_t>(dnll.size()));
  EXPECT_NEAR(r.delta.mean(), static_cast<double>(dm), 1e-9);
  EXPECT_NEAR(r.delta.stderr_of_mean(), dse, 1e-6 * dse);
  EXPECT_NEAR(r.ppl_ratio_bound(0), r.model.ppl() / r.ref.ppl(), 1e-9);
  EXPECT_NEAR(r.ppl_ratio_bound(1.96), std::exp(static_cast<double>(dm) + 1.96 * dse), 1e-9);
  EXPECT_LT(r.ppl_ratio_bound(-1.96), r.ppl_ratio_bound(1.96));

  // A model against itself: zero divergence, full agreement, equal perplexities.
  const KldResult same = evaluate_kld(windows, vocab, ref, ref);
  EXPECT_EQ(same.mean(), 0.0);
  EXPECT_EQ(same.top1_rate(), 1.0);
  EXPECT_EQ(same.ref.sum, same.model.sum);
  EXPECT_EQ(same.delta.mean(), 0.0);
  EXPECT_EQ(same.ppl_ratio_bound(1.96), 1.0);
}

}  // namespace
}  // namespace gyre

namespace gyre {
namespace {

// The README of gyre-ref-25M lists PPL 80.605 (mean NLL 4.38957 over 7,757 tokens in 16
// windows) on tinystories-sample, measured with PyTorch in fp32 on the bf16 weights with the
// "all" rule at context 512. Disabled by default: about 30 CPU-seconds (run with
// --gtest_also_run_disabled_tests).
TEST(Eval, DISABLED_RefModel25MReproducesTheReadmePerplexity) {
  const auto m = load_model(kFixtures + "/gyre-ref-25M");
  auto backend = make_cpu_backend(0);
  Transformer t(m->config, m->weights, *backend, 512);
  EvalOptions o;
  o.ctx = 512;
  o.score_all = true;
  const auto windows = make_eval_windows(
      *m->tokenizer, read_text_file(kFixtures + "/text/tinystories-sample.txt"), o);
  const NllStats st = evaluate_perplexity(windows, m->config.vocab_size, transformer_logits(t));
  EXPECT_EQ(windows.size(), 16u);
  EXPECT_EQ(st.count, 7757);
  EXPECT_NEAR(st.mean(), 4.38957, 2e-5);
  EXPECT_NEAR(st.ppl(), 80.605, 0.005);
}

// The CLI wiring (GYRE_BIN is set by CMake's test registration; skipped when unset).
std::string run_cli(const std::string& args, int& rc) {
  const char* bin = std::getenv("GYRE_BIN");
  const std::string out = testing::TempDir() + "gyre_eval_cli.out";
  rc = std::system((std::string(bin) + " " + args + " > " + out + " 2>" + out + ".err").c_str());
  return read_text_file(out) + read_text_file(out + ".err");
}

TEST(Eval, CliPerplexityAndKld) {
  if (!std::getenv("GYRE_BIN")) GTEST_SKIP() << "GYRE_BIN is not set";
  const std::string text = kFixtures + "/text/tinystories-sample.txt";
  int rc = 0;
  std::string out = run_cli("perplexity -m " + kFixtures + "/stories260K -f " + text +
                                " --ctx 128 --max-windows 3 --device cpu --threads 2 --json",
                            rc);
  ASSERT_EQ(rc, 0) << out;
  const auto j = nlohmann::json::parse(out.substr(0, out.find('\n')));
  // The in-process core on the same windows.
  Stories& s = stories();
  EvalOptions o;
  o.ctx = 128;
  o.max_windows = 3;
  const NllStats st = evaluate_perplexity(make_eval_windows(*s.model->tokenizer, s.text, o),
                                          s.model->config.vocab_size, transformer_logits(*s.t));
  EXPECT_NEAR(j.at("ppl").get<double>(), st.ppl(), 1e-9 * st.ppl());
  EXPECT_EQ(j.at("tokens").get<int64_t>(), st.count);

  // A GPTQ model against its spec-dequantized float twin: identical distributions.
  const std::string data = std::string(GYRE_SOURCE_DIR) + "/tests/data/gptq";
  out = run_cli("kld -m " + data + "/llama --ref " + data + "/llama_float -f " + text +
                    " --ctx 64 --max-windows 2 --device cpu --threads 2 --json",
                rc);
  ASSERT_EQ(rc, 0) << out;
  const auto k = nlohmann::json::parse(out.substr(0, out.find('\n')));
  EXPECT_EQ(k.at("kld_mean").get<double>(), 0.0);
  EXPECT_EQ(k.at("top1_agreement").get<double>(), 1.0);
  EXPECT_GT(k.at("tokens").get<int64_t>(), 20);

  out = run_cli("perplexity -m " + kFixtures + "/stories260K -f /nonexistent.txt", rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("gyre: error:"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
}

}  // namespace
}  // namespace gyre
