// Generator tests. Oracles: llama2.c run.c's greedy goldens for stories260K (fixtures), and a
// naive "cut the whole text at the first stop string" for the stop-string filter.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/generator.h"
#include "model/loader.h"

namespace gyre {
namespace {

// ---- stop strings, no model needed ----

std::string naive_cut(const std::string& text, const std::vector<std::string>& stops) {
  size_t first = std::string::npos;
  for (const auto& s : stops) first = std::min(first, text.find(s));
  return first == std::string::npos ? text : text.substr(0, first);
}

TEST(GeneratorStopFilter, MatchesNaiveCutForEverySplit) {
  std::mt19937 g(7);
  const std::vector<std::vector<std::string>> stop_sets = {
      {"aba"}, {"bb", "abab"}, {"aaab"}, {"b"}, {"abba", "ba", "aaaa"}};
  for (int trial = 0; trial < 400; ++trial) {
    std::string text;
    const int len = static_cast<int>(g() % 24);
    for (int i = 0; i < len; ++i) text += "ab"[g() % 2];
    const auto& stops = stop_sets[static_cast<size_t>(trial) % stop_sets.size()];
    StopStringFilter f(stops);
    std::string out;
    size_t at = 0;
    while (at < text.size() && !f.stopped()) {
      const size_t n = std::min<size_t>(text.size() - at, g() % 4);
      const std::string piece = f.push(text.substr(at, n));
      out += piece;
      at += n;
      // What was emitted so far is always final: a prefix of the cut text.
      ASSERT_EQ(naive_cut(text, stops).compare(0, out.size(), out), 0) << text;
    }
    out += f.finish();
    EXPECT_EQ(out, naive_cut(text, stops)) << "text '" << text << "'";
    EXPECT_EQ(f.stopped(), naive_cut(text, stops).size() != text.size()) << text;
  }
}

TEST(GeneratorStopFilter, HoldsBackPossibleStart) {
  StopStringFilter f({"</end>"});
  EXPECT_EQ(f.push("hello </e"), "hello ");
  EXPECT_EQ(f.push("x"), "</ex");
  EXPECT_EQ(f.push("</en"), "");
  EXPECT_EQ(f.push("d> tail"), "");
  EXPECT_TRUE(f.stopped());
  EXPECT_EQ(f.finish(), "");
  EXPECT_THROW(StopStringFilter({""}), Error);
}

// ---- stories260K against llama2.c's greedy goldens ----

std::string fixture(const std::string& rel) {
  return std::string(GYRE_FIXTURES) + "/" + rel;
}

nlohmann::json golden() {
  std::ifstream f(fixture("stories260K/golden.json"));
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

struct Stories {
  std::unique_ptr<LoadedModel> model;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Transformer> transformer;

  explicit Stories(int max_seq = 512) {
    model = load_model(fixture("stories260K"));
    backend = backend_create("cpu", 1);
    transformer = std::make_unique<Transformer>(model->config, model->weights, *backend, max_seq);
  }
};

GenerationSettings greedy(int max_tokens) {
  GenerationSettings s;
  s.max_tokens = max_tokens;
  s.sampler.temperature = 0.0f;
  s.stop_ids = {1};  // this model ends a story with BOS, as run.c's stop rule says
  return s;
}

std::vector<int> ids_of(const nlohmann::json& j) {
  return j.get<std::vector<int>>();
}

TEST(GeneratorStories, ReproducesGreedyGoldens) {
  Stories m;
  Generator gen(*m.transformer, *m.model->tokenizer);
  const auto all = golden();
  for (const auto& c : all["cases"]) {
    const auto want = ids_of(c["generated_ids"]);
    std::string streamed;
    const GenerationResult r =
        gen.generate(c["prompt"].get<std::string>(), greedy(static_cast<int>(want.size())),
                     [&](std::string_view t) { streamed += t; });
    EXPECT_EQ(r.prompt_ids, ids_of(c["prompt_ids"])) << c["prompt"];
    EXPECT_EQ(r.tokens, want) << c["prompt"];
    EXPECT_EQ(r.text, c["generated_text"].get<std::string>());
    EXPECT_EQ(streamed, r.text);
    EXPECT_EQ(r.finish, FinishReason::Length);
    EXPECT_EQ(r.stats.prompt_tokens, static_cast<int>(r.prompt_ids.size()));
    EXPECT_EQ(r.stats.generated_tokens, static_cast<int>(want.size()));
  }
}

TEST(GeneratorStories, ChunkedPrefillAndCacheReuseGiveTheSameTokens) {
  Stories m;
  Generator gen(*m.transformer, *m.model->tokenizer);
  const auto c = golden()["cases"][2];  // the longest prompt (12 ids)
  const auto want = ids_of(c["generated_ids"]);
  GenerationSettings s = greedy(40);
  s.prefill_chunk = 5;
  const auto first = gen.generate_ids(ids_of(c["prompt_ids"]), s);
  EXPECT_EQ(first.tokens, std::vector<int>(want.begin(), want.begin() + 40));
  EXPECT_EQ(first.stats.cached_tokens, 0);
  const auto again = gen.generate_ids(ids_of(c["prompt_ids"]), s);
  EXPECT_EQ(again.tokens, first.tokens);
  EXPECT_EQ(again.stats.cached_tokens, static_cast<int>(first.prompt_ids.size()) - 1);
  // Continue from prompt + 10 generated ids: the cache holds them, the result is the golden's.
  std::vector<int> longer = ids_of(c["prompt_ids"]);
  longer.insert(longer.end(), want.begin(), want.begin() + 10);
  const auto cont = gen.generate_ids(longer, greedy(20));
  EXPECT_EQ(cont.tokens, std::vector<int>(want.begin() + 10, want.begin() + 30));
  EXPECT_GE(cont.stats.cached_tokens, static_cast<int>(first.prompt_ids.size()));
}

TEST(GeneratorStories, StopStringSpanningTokens) {
  Stories m;
  Generator gen(*m.transformer, *m.model->tokenizer);
  const auto c = golden()["cases"][1];
  const std::string full = c["generated_text"].get<std::string>();
  for (const std::string stop : {"Lily. She", "named", "xyz-never"}) {
    GenerationSettings s = greedy(static_cast<int>(c["generated_ids"].size()));
    s.stop_strings = {stop};
    std::string streamed;
    const auto r =
        gen.generate_ids(ids_of(c["prompt_ids"]), s, [&](std::string_view t) { streamed += t; });
    EXPECT_EQ(r.text, naive_cut(full, {stop}));
    EXPECT_EQ(streamed, r.text);
    EXPECT_EQ(r.finish, full.find(stop) == std::string::npos ? FinishReason::Length
                                                             : FinishReason::StopString);
  }
}

TEST(GeneratorStories, StopIdEndsLikeEos) {
  Stories m;
  Generator gen(*m.transformer, *m.model->tokenizer);
  const auto c = golden()["cases"][1];
  const auto want = ids_of(c["generated_ids"]);
  GenerationSettings s = greedy(0);
  s.stop_ids = {want[7]};
  const auto r = gen.generate_ids(ids_of(c["prompt_ids"]), s);
  const auto first = std::find(want.begin(), want.end(), want[7]);
  EXPECT_EQ(r.tokens, std::vector<int>(want.begin(), first));
  EXPECT_EQ(r.finish, FinishReason::Eos);
  EXPECT_EQ(r.stats.generated_tokens, static_cast<int>(r.tokens.size()) + 1);
}

TEST(GeneratorStories, StopsWhenContextIsFull) {
  Stories m(20);
  Generator gen(*m.transformer, *m.model->tokenizer);
  const auto c = golden()["cases"][1];  // 5 prompt ids
  const auto want = ids_of(c["generated_ids"]);
  const auto r = gen.generate_ids(ids_of(c["prompt_ids"]), greedy(0));
  // 15 more positions fit; the last sampled token needs no position of its own.
  EXPECT_EQ(r.tokens, std::vector<int>(want.begin(), want.begin() + 16));
  EXPECT_EQ(r.finish, FinishReason::ContextFull);
}

TEST(GeneratorStories, RejectsEmptyAndOverlongPrompts) {
  Stories m(8);
  Generator gen(*m.transformer, *m.model->tokenizer);
  EXPECT_THROW(gen.generate_ids({}, greedy(4)), Error);
  EXPECT_THROW(gen.generate_ids(std::vector<int>(9, 5), greedy(4)), Error);
  EXPECT_THROW(gen.generate_ids({1, 600}, greedy(4)), Error);
  EXPECT_NO_THROW(gen.generate_ids(std::vector<int>(8, 5), greedy(4)));
}

TEST(GeneratorStories, SeededSamplingIsReproducible) {
  Stories m;
  Generator gen(*m.transformer, *m.model->tokenizer);
  GenerationSettings s;
  s.max_tokens = 30;
  s.sampler.temperature = 1.0f;
  s.sampler.seed = 99;
  const auto a = gen.generate("Once upon a time", s);
  const auto b = gen.generate("Once upon a time", s);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.text, b.text);
}

}  // namespace
}  // namespace gyre
