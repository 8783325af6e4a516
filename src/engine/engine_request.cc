#include "engine/engine_request.h"

#include <algorithm>

#include "core/error.h"

namespace gyre {

EngineRequest::EngineRequest(uint64_t id, std::vector<int> prompt, const RequestOptions& options,
                             EventCallback cb, const Tokenizer& tok,
                             const std::vector<int>& end_ids, int max_seq)
    : id_(id),
      prompt_(std::move(prompt)),
      options_(options),
      cb_(std::move(cb)),
      end_ids_(end_ids),
      sampler_(options.gen.sampler),
      decoder_(tok, true),
      stops_(options.gen.stop_strings) {
  options_.gen.sampler.validate();
  GYRE_CHECK(options.top_logprobs >= 0 && options.top_logprobs <= 20,
             "top_logprobs must be between 0 and 20, got ", options.top_logprobs);
  GYRE_CHECK(static_cast<bool>(cb_), "a request needs an event callback");
  std::sort(end_ids_.begin(), end_ids_.end());
  end_ids_.erase(std::unique(end_ids_.begin(), end_ids_.end()), end_ids_.end());
  const int cap = max_seq - static_cast<int>(prompt_.size()) + 1;
  token_limit_ = options.gen.max_tokens > 0 ? std::min(options.gen.max_tokens, cap) : cap;
  for (int t : prompt_) sampler_.accept(t);
  // As in Generator: decoding starts after the last prompt token, so the first generated piece
  // keeps its leading space; that token's own text is dropped.
  decoder_.push(prompt_.back());
}

SampleRequest EngineRequest::next_request() {
  SampleRequest r = sampler_.next_request();
  r.logprob = options_.logprobs;
  r.top_logprobs = options_.top_logprobs;
  return r;
}

SampledToken EngineRequest::sampled_token(const SampleResult& r) {
  GYRE_CHECK(r.error.empty(), r.error);
  SampledToken t;
  t.token = r.id;
  t.logprob = r.logprob;
  t.top_logprobs = r.top_logprobs;
  return t;
}

void EngineRequest::fill_counts(TokenEvent& e) const {
  e.prompt_tokens = static_cast<int>(prompt_.size());
  e.completion_tokens = completion_tokens_;
  e.cached_tokens = cached_tokens_;
}

TokenEvent EngineRequest::accept(const SampledToken& t, bool limit_reached) {
  ++completion_tokens_;  // like GenerationStats::generated_tokens: an end id counts too
  TokenEvent e;
  if (std::binary_search(end_ids_.begin(), end_ids_.end(), t.token)) {
    // The end id is not part of the output: a final event without a token.
    e.done = true;
    e.finish = FinishReason::Eos;
    e.text = stops_.push(decoder_.flush());
    if (stops_.stopped())
      e.finish = FinishReason::StopString;
    else
      e.text += stops_.finish();
    fill_counts(e);
    return e;
  }
  sampler_.accept(t.token);
  e.token = t.token;
  e.logprob = t.logprob;
  e.top_logprobs = t.top_logprobs;
  e.text = stops_.push(decoder_.push(t.token));
  if (stops_.stopped()) {
    e.done = true;
    e.finish = FinishReason::StopString;
  } else if (limit_reached) {
    e.done = true;
    const int max_tokens = options_.gen.max_tokens;
    e.finish = max_tokens > 0 && completion_tokens_ >= max_tokens ? FinishReason::Length
                                                                  : FinishReason::ContextFull;
    e.text += stops_.push(decoder_.flush());
    if (stops_.stopped())
      e.finish = FinishReason::StopString;
    else
      e.text += stops_.finish();
  }
  fill_counts(e);
  return e;
}

TokenEvent EngineRequest::final_event(FinishReason reason, const std::string& error) const {
  TokenEvent e;
  e.done = true;
  e.finish = reason;
  e.error = error;
  fill_counts(e);
  return e;
}

bool EngineRequest::deliver(const TokenEvent& e) noexcept {
  try {
    cb_(e);
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace gyre
