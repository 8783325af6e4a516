// Serving engine tests on stories260K (CPU backend). The oracle is the single-sequence
// Generator (itself checked against llama2.c's goldens): every request of a concurrent batch
// must produce exactly what Generator produces alone for the same prompt and settings. Log-
// probabilities are checked against a float64 log-softmax of single-sequence logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "model/loader.h"

namespace gyre {
namespace {

std::string fixture(const std::string& rel) {
  return std::string(GYRE_FIXTURES) + "/" + rel;
}

struct Model {
  std::unique_ptr<LoadedModel> model = load_model(fixture("stories260K"));
  std::unique_ptr<Backend> oracle_backend = backend_create("cpu", 1);
  std::unique_ptr<Backend> backend = backend_create("cpu", 2);
  std::unique_ptr<Transformer> oracle_tf =
      std::make_unique<Transformer>(model->config, model->weights, *oracle_backend, 512);
  Generator oracle{*oracle_tf, *model->tokenizer};

  std::vector<int> encode(const std::string& s) const { return model->tokenizer->encode(s, true); }
};

Model& stories() {
  static Model m;
  return m;
}

// Collects one request's events (the callback runs on the engine thread).
struct Stream {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<TokenEvent> events;
  bool done = false;

  EventCallback callback() {
    return [this](const TokenEvent& e) {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_FALSE(done) << "event after the final one";
      events.push_back(e);
      done = e.done;
      cv.notify_all();
    };
  }
  void wait_events(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return events.size() >= n || done; });
  }
  std::vector<int> tokens() const {
    std::vector<int> t;
    for (const auto& e : events)
      if (e.token >= 0) t.push_back(e.token);
    return t;
  }
  std::string text() const {
    std::string s;
    for (const auto& e : events) s += e.text;
    return s;
  }
  const TokenEvent& last() const { return events.back(); }
};

GenerationSettings greedy(int max_tokens) {
  GenerationSettings s;
  s.max_tokens = max_tokens;
  s.sampler.temperature = 0.0f;
  s.stop_ids = {1};  // this model ends a story with BOS
  return s;
}

RequestOptions opts(const GenerationSettings& g) {
  RequestOptions o;
  o.gen = g;
  return o;
}

void expect_same_as_generator(const std::vector<int>& prompt, const GenerationSettings& g,
                              const Stream& s, const std::string& what) {
  const GenerationResult want = stories().oracle.generate_ids(prompt, g);
  ASSERT_FALSE(s.events.empty()) << what;
  EXPECT_EQ(s.tokens(), want.tokens) << what;
  EXPECT_EQ(s.text(), want.text) << what;
  EXPECT_TRUE(s.last().done) << what;
  EXPECT_EQ(s.last().finish, want.finish) << what;
  EXPECT_EQ(s.last().error, "") << what;
  EXPECT_EQ(s.last().completion_tokens, want.stats.generated_tokens) << what;
  EXPECT_EQ(s.last().prompt_tokens, static_cast<int>(prompt.size())) << what;
}

// 32 prompts: four story openings, and many sharing a long common prefix (several pages).
std::vector<std::vector<int>> mixed_prompts() {
  Model& m = stories();
  const std::vector<std::string> openings = {"Once upon a time", "Lily and Ben went to the park",
                                             "The little dog", "One day, a big cat"};
  const std::string shared =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "sun with her friends. One day,";
  const std::vector<std::string> tails = {" she",     " Lily saw", " the sun", " a bird",
                                          " her mom", " they",     " it was",  " Ben"};
  std::vector<std::vector<int>> prompts;
  for (int i = 0; prompts.size() < 32; ++i) {
    if (i % 3 == 0)
      prompts.push_back(m.encode(openings[size_t(i / 3) % openings.size()]));
    else
      prompts.push_back(
          m.encode(shared + tails[size_t(i) % tails.size()] + std::string(size_t(i / 8), ' ')));
  }
  return prompts;
}

EngineStats run_concurrent_greedy(const EngineConfig& cfg, int max_tokens) {
  Model& m = stories();
  Engine engine(*m.model, *m.backend, cfg);
  const auto prompts = mixed_prompts();
  std::vector<std::unique_ptr<Stream>> streams;
  for (const auto& p : prompts) {
    streams.push_back(std::make_unique<Stream>());
    engine.submit(p, opts(greedy(max_tokens)), streams.back()->callback());
  }
  engine.drain();
  for (size_t i = 0; i < prompts.size(); ++i)
    expect_same_as_generator(prompts[i], greedy(max_tokens), *streams[i],
                             "request " + std::to_string(i));
  const EngineStats st = engine.stats();
  EXPECT_EQ(st.requests_total, prompts.size());
  EXPECT_EQ(st.requests_finished, prompts.size());
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.waiting, 0);
  EXPECT_EQ(st.kv_pages_used, 0);
  return st;
}

TEST(EngineStories, ConcurrentGreedyRequestsMatchGenerator) {
  const EngineStats st = run_concurrent_greedy(EngineConfig{}, 60);
  EXPECT_EQ(st.preemptions, 0u);
  EXPECT_GT(st.cached_prompt_tokens, 0u);  // later shared-prefix prompts found pages cached
}

TEST(EngineStories, SmallStepsAndAFullPoolStillMatchGenerator) {
  // Chunked prefill (24-token steps) and a pool too small for everyone: preemption recomputes.
  EngineConfig cfg;
  cfg.max_step_tokens = 32;
  cfg.page_size = 4;
  cfg.num_pages = 40;
  EXPECT_GT(run_concurrent_greedy(cfg, 40).preemptions, 0u);
}

TEST(EngineStories, SharedPrefixIsComputedOnce) {
  Model& m = stories();
  Engine engine(*m.model, *m.backend, EngineConfig{});
  const auto prompts = mixed_prompts();
  const std::vector<int>& first = prompts[1];  // a shared-prefix prompt
  Stream s0;
  engine.submit(first, opts(greedy(10)), s0.callback());
  s0.wait_events(1000);  // done: its full pages are now in the prefix cache
  EXPECT_EQ(s0.last().cached_tokens, 0);
  // A second wave of prompts sharing its prefix reuses those pages instead of recomputing.
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<size_t> which;
  size_t common_len = first.size();
  for (size_t i = 2; i < prompts.size(); ++i) {
    if (i % 3 == 0) continue;
    size_t c = 0;
    while (c < first.size() && c < prompts[i].size() && first[c] == prompts[i][c]) ++c;
    common_len = std::min(common_len, c);
    streams.push_back(std::make_unique<Stream>());
    which.push_back(i);
    engine.submit(prompts[i], opts(greedy(10)), streams.back()->callback());
  }
  engine.drain();
  const int page = EngineConfig{}.page_size;
  const int expect_cached = int(common_len) / page * page;
  ASSERT_GE(expect_cached, 2 * page);
  uint64_t cached = 0;
  for (size_t k = 0; k < streams.size(); ++k) {
    EXPECT_GE(streams[k]->last().cached_tokens, expect_cached);
    cached += uint64_t(streams[k]->last().cached_tokens);
    expect_same_as_generator(prompts[which[k]], greedy(10), *streams[k], "shared");
  }
  EXPECT_EQ(engine.stats().cached_prompt_tokens, cached);
  EXPECT_GT(engine.stats().kv_pages_cached, 0);  // finished sequences' pages stay cached
}

TEST(EngineStories, CancelMidStream) {
  Model& m = stories();
  Engine engine(*m.model, *m.backend, EngineConfig{});
  GenerationSettings g = greedy(400);
  g.ignore_eos = true;
  g.stop_ids.clear();
  Stream victim, other;
  const auto p = m.encode("Once upon a time");
  // The victim's 5th event holds the engine thread until the test thread has cancelled it, so
  // the cancel lands at a known point: exactly 5 tokens, then the final event.
  std::mutex mu;
  std::condition_variable cv;
  bool reached = false, cancelled = false;
  auto inner = victim.callback();
  int seen = 0;
  const uint64_t id = engine.submit(p, opts(g), [&](const TokenEvent& e) {
    inner(e);
    if (++seen != 5) return;
    std::unique_lock<std::mutex> lock(mu);
    reached = true;
    cv.notify_all();
    cv.wait(lock, [&] { return cancelled; });
  });
  engine.submit(m.encode("The little dog"), opts(greedy(50)), other.callback());
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return reached; });
    engine.cancel(id);
    engine.cancel(id);         // twice: harmless
    engine.cancel(id + 1000);  // unknown: harmless
    cancelled = true;
    cv.notify_all();
  }
  engine.drain();
  ASSERT_TRUE(victim.done);
  EXPECT_EQ(victim.last().finish, FinishReason::Cancelled);
  EXPECT_STREQ(finish_reason_name(FinishReason::Cancelled), "cancelled");
  EXPECT_EQ(victim.tokens().size(), 5u);
  EXPECT_EQ(victim.events.size(), 6u);
  EXPECT_EQ(victim.last().completion_tokens, 5);
  // What it streamed before the cancel is the start of the uncancelled generation.
  const auto want = m.oracle.generate_ids(p, g).tokens;
  const auto got = victim.tokens();
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin()));
  expect_same_as_generator(m.encode("The little dog"), greedy(50), other, "other");
  EXPECT_EQ(engine.stats().requests_cancelled, 1u);
}

TEST(EngineStories, StopStringsAcrossTokenBoundaries) {
  Model& m = stories();
  Engine engine(*m.model, *m.backend, EngineConfig{});
  const auto p = m.encode("Once upon a time");
  const std::string full = m.oracle.generate_ids(p, greedy(100)).text;
  for (const std::string stop : {"Lily. She", "named", "e", "xyz-never"}) {
    GenerationSettings g = greedy(100);
    g.stop_strings = {stop};
    Stream s;
    engine.submit(p, opts(g), s.callback());
    s.wait_events(1000);
    expect_same_as_generator(p, g, s, "stop '" + stop + "'");
    EXPECT_EQ(s.text(), full.substr(0, full.find(stop))) << stop;  // naive cut of the text
  }
}

TEST(EngineStories, SeededSamplingIsReproducibleInAnyBatch) {
  Model& m = stories();
  GenerationSettings g;
  g.max_tokens = 40;
  g.sampler.temperature = 1.0f;
  g.sampler.repetition_penalty = 1.2f;
  g.sampler.seed = 1234;
  const auto p = m.encode("Lily and Ben went to the park");
  Engine engine(*m.model, *m.backend, EngineConfig{});
  Stream alone;
  engine.submit(p, opts(g), alone.callback());
  alone.wait_events(1000);
  expect_same_as_generator(p, g, alone, "alone");
  // The same request among others with other seeds, at different moments.
  std::vector<std::unique_ptr<Stream>> crowd;
  Stream again;
  for (int i = 0; i < 12; ++i) {
    GenerationSettings o = g;
    o.sampler.seed = uint64_t(i);
    crowd.push_back(std::make_unique<Stream>());
    engine.submit(m.encode(i % 2 ? "The little dog" : "One day"), opts(o),
                  crowd.back()->callback());
    if (i == 5) engine.submit(p, opts(g), again.callback());
  }
  engine.drain();
  EXPECT_EQ(again.tokens(), alone.tokens());
  EXPECT_EQ(again.text(), alone.text());
}

TEST(EngineStories, LogprobsMatchFloat64LogSoftmax) {
  Model& m = stories();
  Engine engine(*m.model, *m.backend, EngineConfig{});
  const auto p = m.encode("The little dog");
  RequestOptions o = opts(greedy(3));
  o.logprobs = true;
  o.top_logprobs = 5;
  Stream s;
  engine.submit(p, o, s.callback());
  s.wait_events(1000);
  std::vector<float> logits(size_t(m.model->config.vocab_size));
  m.oracle_tf->forward(p.data(), int(p.size()), 0, logits.data(), false);
  double mx = -1e300, z = 0;
  for (float l : logits) mx = std::max(mx, double(l));
  for (float l : logits) z += std::exp(double(l) - mx);
  auto lp = [&](int id) { return double(logits[size_t(id)]) - mx - std::log(z); };
  const TokenEvent& e = s.events.front();
  EXPECT_NEAR(e.logprob, lp(e.token), 1e-4);
  ASSERT_EQ(e.top_logprobs.size(), 5u);
  EXPECT_EQ(e.top_logprobs[0].first, e.token);  // greedy takes the best
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_NEAR(e.top_logprobs[i].second, lp(e.top_logprobs[i].first), 1e-4);
    if (i) {
      EXPECT_LE(e.top_logprobs[i].second, e.top_logprobs[i - 1].second);
    }
  }
}

TEST(EngineStories, QueueFullAndValidation) {
  Model& m = stories();
  EngineConfig cfg;
  cfg.max_queue = 3;
  Engine engine(*m.model, *m.backend, cfg);
  // The first request's callback holds the engine thread, so the next ones stay queued.
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, release = false;
  Stream blocker;
  auto inner = blocker.callback();
  engine.submit(m.encode("Once upon a time"), opts(greedy(5)), [&](const TokenEvent& e) {
    {
      std::unique_lock<std::mutex> lock(mu);
      entered = true;
      cv.notify_all();
      cv.wait(lock, [&] { return release; });
    }
    inner(e);
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return entered; });
  }
  // Lets the engine thread go however this test ends (a failed expectation must not hang).
  struct Release {
    std::mutex& mu;
    std::condition_variable& cv;
    bool& release;
    ~Release() {
      {
        std::lock_guard<std::mutex> lock(mu);
        release = true;
      }
      cv.notify_all();
    }
  } guard{mu, cv, release};
  std::vector<std::unique_ptr<Stream>> queued;
  for (int i = 0; i < 3; ++i) {
    queued.push_back(std::make_unique<Stream>());
    engine.submit(m.encode("The little dog"), opts(greedy(5)), queued.back()->callback());
  }
  Stream rejected;
  EXPECT_THROW(engine.submit(m.encode("One day"), opts(greedy(5)), rejected.callback()),
               QueueFullError);
  EXPECT_EQ(engine.stats().waiting, 3);
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  // Malformed requests are refused at submit, whatever the queue.
  EXPECT_THROW(engine.submit({}, opts(greedy(5)), rejected.callback()), Error);
  EXPECT_THROW(engine.submit({1, 9999}, opts(greedy(5)), rejected.callback()), Error);
  EXPECT_THROW(engine.submit(std::vector<int>(600, 5), opts(greedy(5)), rejected.callback()),
               Error);
  RequestOptions bad = opts(greedy(5));
  bad.top_logprobs = 21;
  EXPECT_THROW(engine.submit({1, 5}, bad, rejected.callback()), Error);
  bad = opts(greedy(5));
  bad.gen.stop_strings = {""};
  EXPECT_THROW(engine.submit({1, 5}, bad, rejected.callback()), Error);
  engine.drain();
  for (const auto& q : queued) EXPECT_EQ(q->last().finish, FinishReason::Length);
  EXPECT_TRUE(rejected.events.empty());
  // drain() stops intake.
  EXPECT_THROW(engine.submit({1, 5}, opts(greedy(5)), rejected.callback()), Error);
}

TEST(EngineStories, StopsWhenContextIsFull) {
  Model& m = stories();
  EngineConfig cfg;
  cfg.max_seq_len = 20;
  const auto p = m.encode("Once upon a time");
  GenerationSettings g = greedy(0);
  g.ignore_eos = true;
  g.stop_ids.clear();
  Engine engine(*m.model, *m.backend, cfg);
  Stream full;
  engine.submit(p, opts(g), full.callback());
  full.wait_events(1000);
  Transformer tf(m.model->config, m.model->weights, *m.oracle_backend, 20);
  Generator gen(tf, *m.model->tokenizer);
  const auto want = gen.generate_ids(p, g);
  EXPECT_EQ(full.tokens(), want.tokens);
  EXPECT_EQ(full.text(), want.text);
  EXPECT_EQ(full.last().finish, FinishReason::ContextFull);
  EXPECT_EQ(want.finish, FinishReason::ContextFull);
}

TEST(EngineStories, DestructionCancelsWhatIsLeft) {
  Model& m = stories();
  GenerationSettings g = greedy(0);  // until the 512-token context is full: hundreds of steps
  g.ignore_eos = true;
  g.stop_ids.clear();
  Stream left, queued;
  {
    Engine engine(*m.model, *m.backend, EngineConfig{});
    engine.submit(m.encode("Once upon a time"), opts(g), left.callback());
    left.wait_events(1);
    engine.submit(m.encode("The little dog"), opts(g), queued.callback());
  }
  ASSERT_TRUE(left.done);
  EXPECT_EQ(left.last().finish, FinishReason::Cancelled);
  ASSERT_TRUE(queued.done);
  EXPECT_EQ(queued.last().finish, FinishReason::Cancelled);
}

// The CPU backend, with batched attention failing on demand.
class FlakyBackend : public Backend {
 public:
  explicit FlakyBackend(Backend& inner) : in_(inner) {}
  std::atomic<bool> fail_attention{false};

  std::string name() const override { return "flaky " + in_.name(); }
  Tensor alloc(int64_t r, int64_t c) override { return in_.alloc(r, c); }
  Tensor upload_weight(const TensorView& w) override { return in_.upload_weight(w); }
  void to_host(const Tensor& t, float* dst) override { in_.to_host(t, dst); }
  std::unique_ptr<KvCache> new_kv_cache(int l, int h, int d, int n) override {
    return in_.new_kv_cache(l, h, d, n);
  }
  void embed(Tensor& o, const Tensor& t, const int32_t* ids, int n) override {
    in_.embed(o, t, ids, n);
  }
  void rmsnorm(Tensor& o, const Tensor& x, const Tensor& w, float e) override {
    in_.rmsnorm(o, x, w, e);
  }
  void add_rmsnorm(Tensor& r, Tensor& o, const Tensor& d, const Tensor& w, float e) override {
    in_.add_rmsnorm(r, o, d, w, e);
  }
  void matmul(Tensor& o, const Tensor& x, const Tensor& w, const Tensor* b) override {
    in_.matmul(o, x, w, b);
  }
  void rope(Tensor& x, int h, int d, const int32_t* p, const RopeTable& t) override {
    in_.rope(x, h, d, p, t);
  }
  void attention(Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v, KvCache& c, int l,
                 int p0, const AttentionParams& p) override {
    in_.attention(o, q, k, v, c, l, p0, p);
  }
  std::unique_ptr<PagedKvCache> new_paged_kv_cache(int l, int h, int d, int n, int ps) override {
    return in_.new_paged_kv_cache(l, h, d, n, ps);
  }
  void copy_kv_page(PagedKvCache& c, int s, int d, int n) override { in_.copy_kv_page(c, s, d, n); }
  void attention_paged(Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v,
                       PagedKvCache& c, int l, const PagedBatch& b,
                       const AttentionParams& p) override {
    if (fail_attention) fail("injected failure");
    in_.attention_paged(o, q, k, v, c, l, b, p);
  }
  void silu_mul(Tensor& o, const Tensor& g, const Tensor& u) override { in_.silu_mul(o, g, u); }
  void add(Tensor& x, const Tensor& y) override { in_.add(x, y); }

 private:
  Backend& in_;
};

TEST(EngineStories, FailuresEndOnlyTheAffectedRequests) {
  Model& m = stories();
  FlakyBackend flaky(*m.backend);
  Engine engine(*m.model, flaky, EngineConfig{});
  const auto p = m.encode("Once upon a time");
  // A failing step fails the requests in it, with an error event; the engine goes on.
  flaky.fail_attention = true;
  Stream a, b;
  engine.submit(p, opts(greedy(20)), a.callback());
  engine.submit(m.encode("The little dog"), opts(greedy(20)), b.callback());
  a.wait_events(1000);
  b.wait_events(1000);
  for (Stream* s : {&a, &b}) {
    ASSERT_TRUE(s->done);
    EXPECT_NE(s->last().error.find("injected failure"), std::string::npos) << s->last().error;
  }
  flaky.fail_attention = false;
  // A callback that throws ends its own request only.
  Stream ok;
  int calls = 0;
  engine.submit(p, opts(greedy(20)), [&](const TokenEvent&) {
    if (++calls == 1) throw std::runtime_error("client went away");
  });
  engine.submit(p, opts(greedy(20)), ok.callback());
  engine.drain();
  EXPECT_EQ(calls, 2);  // the throwing event, then its final one
  expect_same_as_generator(p, greedy(20), ok, "after failures");
  const EngineStats st = engine.stats();
  EXPECT_EQ(st.running + st.waiting, 0);
  EXPECT_EQ(st.kv_pages_used, 0);
}

TEST(EngineStories, BackendWithoutPagedOpsSaysSo) {
  struct Minimal : FlakyBackend {
    using FlakyBackend::FlakyBackend;
    std::unique_ptr<PagedKvCache> new_paged_kv_cache(int l, int h, int d, int n, int ps) override {
      return Backend::new_paged_kv_cache(l, h, d, n, ps);  // the default
    }
  };
  Model& m = stories();
  Minimal minimal(*m.backend);
  try {
    Engine engine(*m.model, minimal, EngineConfig{});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not support batched serving"), std::string::npos);
  }
}

// Not a test: throughput of 1, 8 and 32 concurrent greedy requests (run with
// --gtest_also_run_disabled_tests).
TEST(EngineStories, DISABLED_Throughput) {
  Model& m = stories();
  GenerationSettings g = greedy(200);
  g.ignore_eos = true;
  g.stop_ids.clear();
  const auto prompts = mixed_prompts();
  for (int n : {1, 8, 32}) {
    Engine engine(*m.model, *m.backend, EngineConfig{});
    std::vector<std::unique_ptr<Stream>> streams;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      streams.push_back(std::make_unique<Stream>());
      engine.submit(prompts[size_t(i)], opts(g), streams.back()->callback());
    }
    engine.drain();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const uint64_t tokens = engine.stats().generated_tokens;
    std::printf("%2d concurrent: %llu tokens in %.3f s = %.0f tokens/s (%s)\n", n,
                static_cast<unsigned long long>(tokens), s, double(tokens) / s,
                m.backend->name().c_str());
  }
}

}  // namespace
}  // namespace gyre
