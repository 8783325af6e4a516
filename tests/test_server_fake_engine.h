// A scripted ServingEngine for the server's HTTP tests: deterministic tokens, a gate to hold
// requests, a queue limit, cancellation and stats like the real engine's.
#pragma once
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "server/engine_api.h"
#include "tokenizer/tokenizer.h"

namespace gyre::test {

// Request k of prompt P generates ids (P.back() + 1 + j) % vocab for j < max_tokens (8 when
// unlimited), one per tick, log-probability -0.25 * (j + 1).
class FakeEngine : public ServingEngine {
 public:
  explicit FakeEngine(const Tokenizer& tok, int max_queue = 64) : tok_(tok), max_queue_(max_queue) {
    worker_ = std::thread([this] { loop(); });
  }
  ~FakeEngine() override {
    {
      std::lock_guard<std::mutex> l(m_);
      quit_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  static std::vector<int> script(const std::vector<int>& prompt, int max_tokens, int vocab) {
    std::vector<int> ids;
    for (int j = 0; j < (max_tokens > 0 ? max_tokens : 8); ++j)
      ids.push_back((prompt.back() + 1 + j) % vocab);
    return ids;
  }
  uint64_t submit(std::vector<int> prompt, const RequestOptions& o, EventCallback cb) override {
    std::lock_guard<std::mutex> l(m_);
    if (draining_) throw Error("draining");
    if (static_cast<int>(active_.size()) >= max_queue_) throw QueueFullError("queue full");
    const uint64_t id = ++next_;
    Req r{script(prompt, o.gen.max_tokens, tok_.vocab_size()),
          0,
          false,
          o,
          std::move(cb),
          static_cast<int>(prompt.size())};
    active_.emplace(id, std::move(r));
    last_prompt_ = prompt;
    last_options_ = o;
    ++stats_.requests_total;
    stats_.prompt_tokens += prompt.size();
    cv_.notify_all();
    return id;
  }
  void cancel(uint64_t id) override {
    std::lock_guard<std::mutex> l(m_);
    auto it = active_.find(id);
    if (it != active_.end()) it->second.cancelled = true;
  }
  void drain() override {
    std::unique_lock<std::mutex> l(m_);
    draining_ = true;
    gate_open_ = true;
    cv_.notify_all();
    cv_.wait(l, [&] { return active_.empty(); });
  }
  EngineStats stats() const override {
    std::lock_guard<std::mutex> l(m_);
    EngineStats s = stats_;
    s.running = static_cast<int>(active_.size());
    s.kv_pages_total = 100;
    s.kv_pages_used = 7;
    return s;
  }
  const Tokenizer& tokenizer() const override { return tok_; }

  void set_tick(std::chrono::milliseconds t) { tick_ = t; }
  void close_gate() { gate_open_ = false; }
  void open_gate() {
    std::lock_guard<std::mutex> l(m_);
    gate_open_ = true;
    cv_.notify_all();
  }
  std::vector<int> last_prompt() const {
    std::lock_guard<std::mutex> l(m_);
    return last_prompt_;
  }
  RequestOptions last_options() const {
    std::lock_guard<std::mutex> l(m_);
    return last_options_;
  }
  int active() const {
    std::lock_guard<std::mutex> l(m_);
    return static_cast<int>(active_.size());
  }

 private:
  struct Req {
    std::vector<int> ids;
    size_t next;
    bool cancelled;
    RequestOptions o;
    EventCallback cb;
    int prompt_tokens;
  };
  void loop() {
    std::unique_lock<std::mutex> l(m_);
    while (true) {
      cv_.wait_for(l, tick_, [&] { return quit_; });
      if (quit_) return;
      if (!gate_open_) continue;
      for (auto it = active_.begin(); it != active_.end();) {
        Req& r = it->second;
        TokenEvent e;
        e.prompt_tokens = r.prompt_tokens;
        if (r.cancelled) {
          e.done = true;
          ++stats_.requests_cancelled;
        } else {
          e.token = r.ids[r.next++];
          e.text = tok_.decode({e.token}, false);
          e.logprob = -0.25f * static_cast<float>(r.next);
          for (int k = 0; k < r.o.top_logprobs; ++k)
            e.top_logprobs.emplace_back((e.token + k) % tok_.vocab_size(), e.logprob - k);
          e.done = r.next == r.ids.size();
          ++stats_.generated_tokens;
          if (e.done) ++stats_.requests_finished;
        }
        e.completion_tokens = static_cast<int>(r.next);
        e.finish = FinishReason::Length;
        r.cb(e);
        it = e.done ? active_.erase(it) : std::next(it);
      }
      cv_.notify_all();
    }
  }
  const Tokenizer& tok_;
  int max_queue_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::map<uint64_t, Req> active_;
  uint64_t next_ = 0;
  bool quit_ = false, draining_ = false;
  std::atomic<bool> gate_open_{true};
  std::chrono::milliseconds tick_{1};
  std::vector<int> last_prompt_;
  RequestOptions last_options_;
  EngineStats stats_;
  std::thread worker_;
};

}  // namespace gyre::test
