// The HTTP layer of `gyre serve` against a scripted engine: request validation, OpenAI response
// shapes, streaming, auth, queue limits, disconnects, metrics and draining. The scripted engine
// emits token ids from a fixed rule, so each expected text is the tokenizer's decoding of ids the
// test computes itself. (test_server_engine.cc runs the real engine.)
#include "test_server_fake_engine.h"
#include "test_server_util.h"

namespace gyre {
namespace {

using nlohmann::json;
using namespace test;

const char* kTemplate =
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}";

class ServerHttp : public ::testing::Test {
 protected:
  void SetUp() override {
    tok_ = Tokenizer::from_folder(fixture("stories260K"));
    engine_ = std::make_unique<FakeEngine>(*tok_);
  }
  ModelContext ctx(int max_seq = 512) const {
    ModelContext c;
    c.name = "stories260K";
    c.tokenizer = tok_.get();
    c.chat_template = kTemplate;
    c.max_seq_len = max_seq;
    return c;
  }
  std::string expected_text(const std::vector<int>& prompt, int max_tokens) const {
    std::string s;
    for (int id : FakeEngine::script(prompt, max_tokens, tok_->vocab_size()))
      s += tok_->decode({id}, false);
    return s;
  }
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<FakeEngine> engine_;
};

TEST_F(ServerHttp, CompletionShapeTextAndUsage) {
  RunningServer srv(*engine_, ctx());
  auto c = srv.client();
  json r =
      post_json(c, "/v1/completions",
                {{"model", "stories260K"}, {"prompt", "Once upon a time"}, {"max_tokens", 5}}, 200);
  const std::vector<int> prompt = tok_->encode("Once upon a time", true);
  EXPECT_EQ(engine_->last_prompt(), prompt);
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["model"], "stories260K");
  EXPECT_EQ(r["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  ASSERT_EQ(r["choices"].size(), 1u);
  EXPECT_EQ(r["choices"][0]["text"], expected_text(prompt, 5));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(r["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(r["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(r["usage"]["completion_tokens"], 5);
  EXPECT_EQ(r["usage"]["total_tokens"], prompt.size() + 5);
}

TEST_F(ServerHttp, SamplingFieldsReachTheEngine) {
  RunningServer srv(*engine_, ctx());
  auto c = srv.client();
  post_json(c, "/v1/completions",
            {{"model", "gyre"},
             {"prompt", {5, 6, 7}},
             {"max_tokens", 3},
             {"temperature", 0.5},
             {"top_p", 0.9},
             {"top_k", 40},
             {"min_p", 0.05},
             {"typical_p", 0.8},
             {"presence_penalty", 0.5},
             {"frequency_penalty", -0.5},
             {"repetition_penalty", 1.1},
             {"seed", 1234},
             {"stop", {"a", "bc"}},
             {"unknown_field", {1, 2}}},
            200);
  EXPECT_EQ(engine_->last_prompt(), (std::vector<int>{5, 6, 7}));
  const RequestOptions o = engine_->last_options();
  EXPECT_EQ(o.gen.max_tokens, 3);
  EXPECT_FLOAT_EQ(o.gen.sampler.temperature, 0.5f);
  EXPECT_FLOAT_EQ(o.gen.sampler.top_p, 0.9f);
  EXPECT_EQ(o.gen.sampler.top_k, 40);
  EXPECT_FLOAT_EQ(o.gen.sampler.min_p, 0.05f);
  EXPECT_FLOAT_EQ(o.gen.sampler.typical_p, 0.8f);
  EXPECT_FLOAT_EQ(o.gen.sampler.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(o.gen.sampler.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(o.gen.sampler.repetition_penalty, 1.1f);
  EXPECT_EQ(o.gen.sampler.seed, 1234u);
  EXPECT_EQ(o.gen.stop_strings, (std::vector<std::string>{"a", "bc"}));
}

TEST_F(ServerHttp, ChatRendersTemplateAndLogprobs) {
  RunningServer srv(*engine_, ctx());
  auto c = srv.client();
  json r = post_json(c, "/v1/chat/completions",
                     {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                      {"max_tokens", 4},
                      {"logprobs", true},
                      {"top_logprobs", 2}},
                     200);
  // The template renders to "<user>Hi<assistant>", encoded without BOS.
  const std::vector<int> prompt = tok_->encode("<user>Hi<assistant>", false);
  EXPECT_EQ(engine_->last_prompt(), prompt);
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r["choices"][0]["message"]["content"], expected_text(prompt, 4));
  const json& lp = r["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 4u);
  const auto ids = FakeEngine::script(prompt, 4, tok_->vocab_size());
  for (size_t j = 0; j < 4; ++j) {
    EXPECT_EQ(lp[j]["token"], tok_->decode({ids[j]}, false));
    EXPECT_FLOAT_EQ(lp[j]["logprob"].get<float>(), -0.25f * static_cast<float>(j + 1));
    EXPECT_EQ(lp[j]["top_logprobs"].size(), 2u);
  }
}

TEST_F(ServerHttp, CompletionLogprobsAndSeveralChoices) {
  RunningServer srv(*engine_, ctx());
  auto c = srv.client();
  json r = post_json(c, "/v1/completions",
                     {{"prompt", "Hello"}, {"max_tokens", 3}, {"n", 3}, {"logprobs", 1}}, 200);
  ASSERT_EQ(r["choices"].size(), 3u);
  const auto prompt = tok_->encode("Hello", true);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r["choices"][i]["index"], i);
    EXPECT_EQ(r["choices"][i]["text"], expected_text(prompt, 3));
    EXPECT_EQ(r["choices"][i]["logprobs"]["tokens"].size(), 3u);
    EXPECT_EQ(r["choices"][i]["logprobs"]["top_logprobs"][0].size(), 1u);
  }
  EXPECT_EQ(r["usage"]["completion_tokens"], 9);
}

TEST_F(ServerHttp, StreamingCompletionAndChat) {
  RunningServer srv(*engine_, ctx());
  auto c = srv.client();
  json body = {{"prompt", "Once"},
               {"max_tokens", 6},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  auto res = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  auto events = sse_payloads(res->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  std::string finish;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    json e = json::parse(events[i]);
    EXPECT_EQ(e["object"], "text_completion");
    text += e["choices"][0]["text"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, expected_text(tok_->encode("Once", true), 6));
  EXPECT_EQ(finish, "length");
  json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 6);

  body = {
      {"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 5}, {"stream", true}};
  res = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  events = sse_payloads(res->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  text.clear();
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json d = json::parse(events[i])["choices"][0]["delta"];
    if (d.contains("content")) text += d["content"].get<std::string>();
  }
  EXPECT_EQ(text, expected_text(tok_->encode("<user>Hi<assistant>", false), 5));
}

TEST_F(ServerHttp, ModelsHealthAndUnknownRoutes) {
  RunningServer srv(*engine_, ctx());
  auto c = srv.client();
  auto res = c.Get("/v1/models");
  ASSERT_TRUE(res);
  json m = json::parse(res->body);
  EXPECT_EQ(m["data"][0]["id"], "stories260K");
  res = c.Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  res = c.Get("/v1/nope");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
  EXPECT_EQ(json::parse(res->body)["error"]["type"], "not_found_error");
  json r = post_json(c, "/v1/completions", {{"model", "gpt-4"}, {"prompt", "x"}}, 404);
  EXPECT_EQ(r["error"]["code"], "model_not_found");
}

// Every malformed request gets a 4xx in OpenAI's error shape, and the server keeps serving.
TEST_F(ServerHttp, MalformedAndHostileRequests) {
  RunningServer srv(*engine_, ctx(64));
  auto c = srv.client();
  struct Case {
    std::string path, body;
    int status;
  };
  const std::string big_prompt(2000, 'a');
  const std::vector<Case> cases = {
      {"/v1/completions", "{not json", 400},
      {"/v1/completions", "", 400},
      {"/v1/completions", "[1,2]", 400},
      {"/v1/completions", std::string("{\"prompt\": \"a\xff\xfe b\"}"), 400},  // bad UTF-8
      {"/v1/chat/completions",
       std::string("{\"messages\": [{\"role\": \"user\", \"content\": \"\xc3\"}]}"), 400},
      {"/v1/completions", R"({"prompt": 5})", 400},
      {"/v1/completions", R"({})", 400},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": -1})", 400},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": "ten"})", 400},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": 1e999})", 400},
      {"/v1/completions", R"({"prompt": "a", "temperature": -0.1})", 400},
      {"/v1/completions", R"({"prompt": "a", "temperature": "hot"})", 400},
      {"/v1/completions", R"({"prompt": "a", "top_p": 0})", 400},
      {"/v1/completions", R"({"prompt": "a", "n": 0})", 400},
      {"/v1/completions", R"({"prompt": "a", "n": 1000})", 400},
      {"/v1/completions", R"({"prompt": "a", "stop": 5})", 400},
      {"/v1/completions", R"({"prompt": "a", "stream": "yes"})", 400},
      {"/v1/completions", R"({"prompt": "a", "logprobs": 21})", 400},
      {"/v1/completions", R"({"prompt": "a", "seed": 1.5})", 400},
      {"/v1/completions", R"({"prompt": [1, 99999]})", 400},
      {"/v1/completions", R"({"prompt": [1, -3]})", 400},
      {"/v1/completions", R"({"prompt": []})", 400},
      {"/v1/completions", R"({"prompt": "a", "model": 7})", 400},
      {"/v1/completions", R"({"prompt": ")" + big_prompt + R"("})", 413},
      {"/v1/chat/completions", R"({"messages": "hi"})", 400},
      {"/v1/chat/completions", R"({"messages": []})", 400},
      {"/v1/chat/completions", R"({"messages": [{"content": "x"}]})", 400},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": 3}]})", 400},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", 400},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "x"}], "model": "other"})", 404},
  };
  for (const Case& k : cases) {
    auto res = c.Post(k.path.c_str(), k.body, "application/json");
    ASSERT_TRUE(res) << k.body.substr(0, 80);
    EXPECT_EQ(res->status, k.status) << k.body.substr(0, 80) << " -> " << res->body;
    json e = json::parse(res->body, nullptr, false);
    ASSERT_FALSE(e.is_discarded()) << res->body;
    EXPECT_TRUE(e["error"]["message"].is_string()) << res->body;
    EXPECT_TRUE(e["error"].contains("type") && e["error"].contains("param") &&
                e["error"].contains("code"))
        << res->body;
  }
  // A body over the limit is refused before it is parsed.
  auto res = c.Post("/v1/completions", std::string(5u << 20, ' '), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 413);
  EXPECT_EQ(json::parse(res->body)["error"]["code"], "body_too_large");
  // Raw garbage and an oversized chunked body (no Content-Length) are refused too.
  auto raw_status = [&](const std::string& request) {
    const int fd = connect_raw(srv.port());
    EXPECT_GE(fd, 0);
    size_t sent = 0;
    while (sent < request.size()) {
      const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;  // the server may close early once it has answered
      sent += static_cast<size_t>(n);
    }
    char buf[64] = {};
    const ssize_t n = ::recv(fd, buf, sizeof buf - 1, 0);
    ::close(fd);
    return n > 12 ? std::string(buf + 9, 3) : std::string("none");
  };
  EXPECT_EQ(raw_status("GARBAGE \x01\x02\r\n\r\n"), "400");
  // A chunked body (no Content-Length) that is a valid request: answered when small, refused
  // when over the limit (httplib stops reading there; it answers 400 or 413 for chunked bodies).
  auto chunked_request = [](size_t pad_mib) {
    auto chunk = [](const std::string& data) {
      char size[16];
      std::snprintf(size, sizeof size, "%zx\r\n", data.size());
      return size + data + "\r\n";
    };
    std::string r =
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    r += chunk(R"({"prompt": "a", "max_tokens": 1, "pad": ")");
    for (size_t i = 0; i < pad_mib; ++i) r += chunk(std::string(1 << 20, ' '));
    return r + chunk("\"}") + "0\r\n\r\n";
  };
  EXPECT_EQ(raw_status(chunked_request(1)), "200");
  const std::string status = raw_status(chunked_request(6));
  EXPECT_TRUE(status == "413" || status == "400") << status;
  // Still serving.
  post_json(c, "/v1/completions", {{"prompt", "a"}, {"max_tokens", 1}}, 200);
}

TEST_F(ServerHttp, BearerAuth) {
  ServerOptions opt;
  opt.api_key = "s3cret";
  RunningServer srv(*engine_, ctx(), opt);
  auto c = srv.client();
  const json body = {{"prompt", "a"}, {"max_tokens", 1}};
  auto res = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401);
  EXPECT_EQ(json::parse(res->body)["error"]["type"], "authentication_error");
  res = c.Post("/v1/completions", {{"Authorization", "Bearer wrong"}}, body.dump(),
               "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401);
  EXPECT_EQ(c.Get("/v1/models")->status, 401);
  EXPECT_EQ(c.Get("/health")->status, 200);
  res = c.Post("/v1/completions", {{"Authorization", "Bearer s3cret"}}, body.dump(),
               "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

TEST_F(ServerHttp, QueueFullIs429) {
  engine_ = std::make_unique<FakeEngine>(*tok_, /*max_queue=*/1);
  engine_->close_gate();
  RunningServer srv(*engine_, ctx());
  std::thread first([&] {
    auto c = srv.client();
    post_json(c, "/v1/completions", {{"prompt", "a"}, {"max_tokens", 2}}, 200);
  });
  while (engine_->active() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  auto c = srv.client();
  json r = post_json(c, "/v1/completions", {{"prompt", "b"}, {"max_tokens", 2}}, 429);
  EXPECT_EQ(r["error"]["type"], "rate_limit_error");
  engine_->open_gate();
  first.join();
}

TEST_F(ServerHttp, ClientDisconnectCancelsStream) {
  engine_->set_tick(std::chrono::milliseconds(5));
  RunningServer srv(*engine_, ctx());
  const int fd = connect_raw(srv.port());
  ASSERT_GE(fd, 0);
  const std::string req = http_post_text(
      "/v1/completions", R"({"prompt": "Once", "max_tokens": 100000, "stream": true})");
  ASSERT_EQ(::send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  char buf[512];
  std::string got;
  while (got.find("data: ") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  EXPECT_EQ(wait_metric(srv.port(), "gyre_requests_cancelled_total", 1), 1);
  EXPECT_EQ(engine_->active(), 0);
}

TEST_F(ServerHttp, MetricsReportEngineStats) {
  RunningServer srv(*engine_, ctx());
  auto c = srv.client();
  post_json(c, "/v1/completions", {{"prompt", {1, 2, 3}}, {"max_tokens", 4}}, 200);
  post_json(c, "/v1/completions", {{"prompt", {1, 2}}, {"max_tokens", 2}}, 200);
  EXPECT_EQ(get_metric(srv.port(), "gyre_requests_total"), 2);
  EXPECT_EQ(get_metric(srv.port(), "gyre_requests_finished_total"), 2);
  EXPECT_EQ(get_metric(srv.port(), "gyre_prompt_tokens_total"), 5);
  EXPECT_EQ(get_metric(srv.port(), "gyre_generated_tokens_total"), 6);
  EXPECT_EQ(get_metric(srv.port(), "gyre_kv_pages_total"), 100);
  EXPECT_EQ(get_metric(srv.port(), "gyre_kv_pages_used"), 7);
  EXPECT_EQ(get_metric(srv.port(), "gyre_queue_depth"), 0);
}

// shutdown(): the in-flight request completes, later ones get 503, then serve() returns.
TEST_F(ServerHttp, ShutdownDrainsInFlightRequests) {
  engine_->set_tick(std::chrono::milliseconds(10));
  RunningServer srv(*engine_, ctx());
  json r;
  std::thread inflight([&] {
    auto c = srv.client();
    r = post_json(c, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 30}}, 200);
  });
  while (engine_->active() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::thread stopper([&] { srv.server().shutdown(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto c = srv.client();
  auto res = c.Post("/v1/completions", R"({"prompt": "x"})", "application/json");
  if (res) {
    EXPECT_EQ(res->status, 503);  // or refused once the listener is closed
  }
  inflight.join();
  stopper.join();
  srv.stop();
  EXPECT_EQ(r["choices"][0]["text"], expected_text(tok_->encode("Once", true), 30));
}

}  // namespace
}  // namespace gyre
