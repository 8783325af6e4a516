// Parsing and validating OpenAI-style request bodies (/v1/completions, /v1/chat/completions)
// into engine requests. Every problem is an ApiError carrying the HTTP status and OpenAI's
// error type, so handlers can answer {"error": {"message", "type", "param", "code"}}.
#pragma once
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace gyre {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string code = {});
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }

 private:
  int status_;
  std::string type_, param_, code_;
};

// {"error": {...}} for a status and message (type follows from the status).
nlohmann::ordered_json error_body(int status, const std::string& message,
                                  const std::string& param = {}, const std::string& code = {});

// What the parser needs to know about the served model.
struct ModelContext {
  std::string name;            // the served model's name (accepted as "model", as is "gyre")
  const Tokenizer* tokenizer;  // encodes prompts and rendered chat templates
  std::string chat_template;   // empty: /v1/chat/completions answers 400
  std::string bos_token, eos_token;
  std::vector<int> end_of_turn_ids;  // extra stop ids for chat replies
  int max_seq_len = 4096;
};

constexpr int kMaxChoices = 16;  // n in 1..kMaxChoices
constexpr int kMaxLogprobs = 20;

struct ParsedRequest {
  bool chat = false;
  std::vector<int> prompt_ids;
  RequestOptions options;  // n requests share these; choice i uses seed + i
  int n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // completions: "logprobs": N; chat: "logprobs": true
};

// body: the parsed JSON (any type). Throws ApiError.
ParsedRequest parse_completion_request(const nlohmann::ordered_json& body, const ModelContext& ctx);
ParsedRequest parse_chat_request(const nlohmann::ordered_json& body, const ModelContext& ctx);

// Parses a request body; bad JSON (including invalid UTF-8 in strings) is a 400 ApiError.
nlohmann::ordered_json parse_body(const std::string& body);

}  // namespace gyre
