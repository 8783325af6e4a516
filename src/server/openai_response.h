// Building OpenAI-shaped response bodies from engine events: whole responses (choices collected
// until every one is done) and server-sent-event chunks for streaming.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace gyre {

struct ResponseMeta {
  std::string id;  // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;
  std::string model;
  bool chat = false;
  bool logprobs = false;
};

// One sampled token with its log-probabilities.
struct TokenLogprob {
  int id;
  float logprob;
  std::vector<std::pair<int, float>> top;
};

struct ChoiceResult {
  std::string text;
  std::vector<TokenLogprob> logprobs;
  bool done = false;
  FinishReason finish = FinishReason::Length;
  std::string error;
  int prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;

  void add(const TokenEvent& e, bool want_logprobs);
};

// "stop" (EOS, a stop id or stop string) or "length" (max_tokens, the context).
const char* openai_finish_reason(FinishReason r);

// Usage over the choices: the prompt counted once, completions summed.
nlohmann::ordered_json usage_json(const std::vector<ChoiceResult>& choices);

nlohmann::ordered_json full_response(const ResponseMeta& meta,
                                     const std::vector<ChoiceResult>& choices,
                                     const Tokenizer& tok);

// One streamed chunk for choice `index`: new text, its tokens' log-probabilities, and the
// finish reason when finish is non-null. role: chat's first chunk (delta.role = assistant).
nlohmann::ordered_json stream_chunk(const ResponseMeta& meta, int index, const std::string& text,
                                    const std::vector<TokenLogprob>& logprobs, const char* finish,
                                    bool role, const Tokenizer& tok);
// The final chunk with usage and no choices (stream_options.include_usage).
nlohmann::ordered_json usage_chunk(const ResponseMeta& meta,
                                   const std::vector<ChoiceResult>& choices);

// "data: <json>\n\n"; strings that are not valid UTF-8 are repaired with U+FFFD.
std::string sse_event(const nlohmann::ordered_json& j);
std::string dump_json(const nlohmann::ordered_json& j);

}  // namespace gyre
