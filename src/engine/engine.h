// The serving engine: many requests share one model. A background thread runs the scheduler
// loop (engine/scheduler.h over engine/kv_pages.h): continuous batching, chunked prefill, prefix
// sharing; each request samples with its own settings and streams events through its callback.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/generator.h"
#include "model/loader.h"

namespace gyre {

// submit() when the queue is full (servers answer 429).
class QueueFullError : public Error {
 public:
  using Error::Error;
};

struct RequestOptions {
  GenerationSettings gen;  // max_tokens, stop strings, stop ids, ignore_eos, sampler (+ seed)
  bool logprobs = false;   // report the sampled token's log-probability
  int top_logprobs = 0;    // 0..20 alternatives per generated token
};

struct TokenEvent {
  std::string text;  // newly final text (whole UTF-8 characters, never part of a stop string)
  int token = -1;    // the sampled id (-1 on a final event that carries no token)
  float logprob = 0.0f;
  std::vector<std::pair<int, float>> top_logprobs;  // (id, log-probability), best first
  bool done = false;
  FinishReason finish = FinishReason::Length;  // valid when done
  std::string error;                           // non-empty: the request failed (done is true)
  // completion_tokens counts sampled tokens, an ending EOS/stop id included (it is not part of
  // the output: it ends the request with a final event whose token is -1).
  int prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};

// Called on the engine thread, in order, exactly once with done == true per accepted request.
// Must not block for long.
using EventCallback = std::function<void(const TokenEvent&)>;

struct EngineConfig {
  int max_batch = 32;         // sequences in one step
  int max_queue = 256;        // waiting requests before submit() throws QueueFullError
  int max_step_tokens = 512;  // token budget per step (prefill chunks + decodes)
  int page_size = 16;         // tokens per KV page
  int num_pages = 0;          // 0: enough for max_batch sequences of max_seq_len
  int max_seq_len = 4096;     // prompt + generated tokens per request
};

struct EngineStats {
  uint64_t requests_total = 0, requests_finished = 0, requests_cancelled = 0;
  int running = 0, waiting = 0;
  uint64_t prompt_tokens = 0, cached_prompt_tokens = 0, generated_tokens = 0;
  int kv_pages_total = 0, kv_pages_used = 0, kv_pages_shared = 0, kv_pages_cached = 0;
  double tokens_per_s = 0;   // generated tokens per second over the last few seconds
  uint64_t preemptions = 0;  // sequences sent back to recompute when KV pages ran out
};

class Engine {
 public:
  Engine(const LoadedModel& model, Backend& backend, const EngineConfig& config);
  ~Engine();  // cancels what is left and joins the loop thread

  // Validates the prompt (throws gyre::Error: empty, too long, bad ids) and queues it
  // (QueueFullError when full). Returns the request id.
  uint64_t submit(std::vector<int> prompt_ids, const RequestOptions& options, EventCallback cb);
  void cancel(uint64_t id);  // its callback gets a final event (finish reason: cancelled)
  // Stops accepting requests and returns when every accepted one has finished.
  void drain();
  EngineStats stats() const;
  const Tokenizer& tokenizer() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gyre
