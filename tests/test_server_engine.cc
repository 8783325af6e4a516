// `gyre serve`'s HTTP layer over the real batching engine with stories260K on the CPU. The
// oracle for every greedy text is the single-sequence Generator (engine/generator.h) run on
// its own Transformer: the server must return exactly what one request alone produces, also
// with 32 clients at once.
#include <atomic>

#include "backend/backend.h"
#include "engine/generator.h"
#include "model/loader.h"
#include "test_server_util.h"

namespace gyre {
namespace {

using nlohmann::json;
using namespace test;

constexpr int kMaxSeq = 512;

class ServerEngine : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = load_model(fixture("stories260K")).release();
    backend_ = backend_create("cpu", 1).release();
  }
  static void TearDownTestSuite() {
    delete backend_;
    delete model_;
  }
  void SetUp() override {
    EngineConfig ec;
    ec.max_batch = 32;
    ec.max_seq_len = kMaxSeq;
    engine_ = make_serving_engine(*model_, *backend_, ec);
  }
  ModelContext ctx() const {
    ModelContext c;
    c.name = "stories260K";
    c.tokenizer = model_->tokenizer.get();
    c.chat_template =
        "{% for m in messages %}{{ bos_token }}{{ m['role'] }}: {{ m['content'] }}\n"
        "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";
    c.bos_token = "<s>";
    c.max_seq_len = kMaxSeq;
    return c;
  }
  // What one greedy request alone gives: the Generator on a Transformer of its own.
  static GenerationResult reference(const std::vector<int>& prompt, int max_tokens) {
    Transformer t(model_->config, model_->weights, *backend_, kMaxSeq);
    Generator g(t, *model_->tokenizer);
    GenerationSettings s;
    s.max_tokens = max_tokens;
    s.sampler.temperature = 0;
    s.sampler.top_p = 1;
    return g.generate_ids(prompt, s);
  }
  static std::vector<int> encode(const std::string& text) {
    return model_->tokenizer->encode(text, true);
  }
  static LoadedModel* model_;
  static Backend* backend_;
  std::unique_ptr<ServingEngine> engine_;
};
LoadedModel* ServerEngine::model_ = nullptr;
Backend* ServerEngine::backend_ = nullptr;

const char* const kPrompts[] = {"Once upon a time",         "The little dog", "Lily saw a big",
                                "One day, a boy named Tim", "The sun was",    "She liked to"};

TEST_F(ServerEngine, GreedyCompletionMatchesGenerator) {
  RunningServer srv(*engine_, ctx());
  auto c = srv.client();
  for (const char* p : {kPrompts[0], kPrompts[1]}) {
    const GenerationResult ref = reference(encode(p), 40);
    json r = post_json(c, "/v1/completions",
                       {{"model", "stories260K"},
                        {"prompt", p},
                        {"max_tokens", 40},
                        {"temperature", 0},
                        {"logprobs", 2}},
                       200);
    EXPECT_EQ(r["choices"][0]["text"], ref.text) << p;
    EXPECT_EQ(r["usage"]["prompt_tokens"], ref.prompt_ids.size());
    EXPECT_EQ(r["usage"]["completion_tokens"], ref.stats.generated_tokens);
    const json& lp = r["choices"][0]["logprobs"];
    ASSERT_GE(lp["token_logprobs"].size(), ref.tokens.size());
    for (size_t i = 0; i < ref.tokens.size(); ++i) {
      EXPECT_LE(lp["token_logprobs"][i].get<double>(), 1e-6);
      // Greedy: the sampled token is the best alternative.
      EXPECT_EQ(lp["tokens"][i], model_->tokenizer->decode({ref.tokens[i]}, false));
    }
  }
}

TEST_F(ServerEngine, StreamingAndChatMatchGenerator) {
  RunningServer srv(*engine_, ctx());
  auto c = srv.client();
  const GenerationResult ref = reference(encode(kPrompts[2]), 30);
  auto res =
      c.Post("/v1/completions",
             json{{"prompt", kPrompts[2]}, {"max_tokens", 30}, {"temperature", 0}, {"stream", true}}
                 .dump(),
             "application/json");
  ASSERT_TRUE(res);
  std::string text;
  for (const std::string& e : sse_payloads(res->body))
    if (e != "[DONE]") text += json::parse(e)["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, ref.text);

  // Chat: the template renders "<s>user: Hi\nassistant:".
  const std::vector<int> chat_prompt = model_->tokenizer->encode("<s>user: Hi\nassistant:", false);
  const GenerationResult chat_ref = reference(chat_prompt, 20);
  json r = post_json(c, "/v1/chat/completions",
                     {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                      {"max_tokens", 20},
                      {"temperature", 0}},
                     200);
  EXPECT_EQ(r["choices"][0]["message"]["content"], chat_ref.text);
  EXPECT_EQ(r["usage"]["prompt_tokens"], chat_prompt.size());
}

// 32 clients at once, each with its own prompt and length: each gets exactly its solo text.
TEST_F(ServerEngine, ConcurrentClientsGetTheirSoloText) {
  constexpr int kClients = 32;
  std::vector<std::string> prompts;
  std::vector<int> lengths;
  std::vector<GenerationResult> refs;
  for (int i = 0; i < kClients; ++i) {
    std::string p = kPrompts[i % 6];
    if (i >= 6) p.append(" ").append(std::to_string(i));
    prompts.push_back(p);
    lengths.push_back(8 + (i * 7) % 40);
    refs.push_back(reference(encode(p), lengths.back()));
  }
  RunningServer srv(*engine_, ctx());
  std::vector<std::string> got(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] {
      auto c = srv.client();
      const bool stream = i % 2 == 1;
      auto res = c.Post("/v1/completions",
                        json{{"prompt", prompts[i]},
                             {"max_tokens", lengths[i]},
                             {"temperature", 0},
                             {"stream", stream}}
                            .dump(),
                        "application/json");
      if (!res || res->status != 200) {
        got[i] = res ? "HTTP " + std::to_string(res->status) + ": " + res->body
                     : "no response: " + httplib::to_string(res.error());
        return;
      }
      if (!stream) {
        got[i] = json::parse(res->body)["choices"][0]["text"];
        return;
      }
      for (const std::string& e : sse_payloads(res->body))
        if (e != "[DONE]") got[i] += json::parse(e)["choices"][0]["text"].get<std::string>();
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) EXPECT_EQ(got[i], refs[i].text) << "client " << i;
  EXPECT_EQ(wait_metric(srv.port(), "gyre_requests_finished_total", kClients), kClients);
}

TEST_F(ServerEngine, DisconnectCancelsAndMetricsCount) {
  RunningServer srv(*engine_, ctx());
  auto c = srv.client();
  json r = post_json(c, "/v1/completions",
                     {{"prompt", kPrompts[0]}, {"max_tokens", 10}, {"temperature", 0}}, 200);
  const int fd = connect_raw(srv.port());
  ASSERT_GE(fd, 0);
  const std::string req = http_post_text(
      "/v1/completions",
      R"({"prompt": "Once", "max_tokens": 480, "ignore_eos": true, "stream": true})");
  ASSERT_EQ(::send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  char buf[256];
  std::string got;
  while (got.find("data: ") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  EXPECT_EQ(wait_metric(srv.port(), "gyre_requests_cancelled_total", 1), 1);
  EXPECT_EQ(get_metric(srv.port(), "gyre_requests_total"), 2);
  EXPECT_EQ(wait_metric(srv.port(), "gyre_requests_finished_total", 1), 1);
  EXPECT_LT(get_metric(srv.port(), "gyre_generated_tokens_total"),
            10 + 480);  // the cancelled one stopped early
  EXPECT_GE(get_metric(srv.port(), "gyre_prompt_tokens_total"),
            r["usage"]["prompt_tokens"].get<double>());
  EXPECT_EQ(get_metric(srv.port(), "gyre_requests_running"), 0);
  EXPECT_GT(get_metric(srv.port(), "gyre_kv_pages_total"), 0);
}

}  // namespace
}  // namespace gyre
