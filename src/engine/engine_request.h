// One request inside the engine (internal to engine.cc): its own sampler, stream decoder and
// stop-string filter, and the rules that turn a sampled token into a TokenEvent, the same rules
// Generator::generate_ids applies to a single sequence.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"

namespace gyre {

struct SampledToken {
  int token = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int, float>> top_logprobs;
};

class EngineRequest {
 public:
  // Validates the options (throws gyre::Error). max_seq: the context positions a request may use.
  EngineRequest(uint64_t id, std::vector<int> prompt, const RequestOptions& options,
                EventCallback cb, const Tokenizer& tok, const std::vector<int>& end_ids,
                int max_seq);

  uint64_t id() const { return id_; }
  const std::vector<int>& prompt() const { return prompt_; }
  const std::vector<int>& end_ids() const { return end_ids_; }
  // Tokens the scheduler may let it generate: the user's max_tokens, capped where the context
  // is full (the last sampled token needs no position: max_seq - prompt + 1).
  int token_limit() const { return token_limit_; }

  // The next token's sample request (Backend::sample): settings, penalties, this request's next
  // uniform number, and the log-probabilities asked for.
  SampleRequest next_request();
  // The sampled token as the engine reports it (throws gyre::Error for a failed row).
  static SampledToken sampled_token(const SampleResult& r);
  // Applies a sampled token; `limit_reached` when the scheduler ended the sequence on its token
  // limit. Returns the event to send; done is set when the request ends here.
  TokenEvent accept(const SampledToken& t, bool limit_reached);
  // The final event of a request ended from outside (cancel or error).
  TokenEvent final_event(FinishReason reason, const std::string& error = {}) const;

  void set_cached_tokens(int n) { cached_tokens_ = n; }
  // Delivers an event; false if the callback threw (the request must then end).
  bool deliver(const TokenEvent& e) noexcept;

 private:
  void fill_counts(TokenEvent& e) const;

  uint64_t id_;
  std::vector<int> prompt_;
  RequestOptions options_;
  EventCallback cb_;
  std::vector<int> end_ids_;  // sorted
  int token_limit_ = 1;
  Sampler sampler_;
  StreamDecoder decoder_;
  StopStringFilter stops_;
  int completion_tokens_ = 0, cached_tokens_ = 0;
};

}  // namespace gyre
