#include "server/openai_request.h"

#include <cmath>
#include <limits>
#include <random>

#include "tokenizer/chat_template.h"

namespace gyre {

namespace {

using Json = nlohmann::ordered_json;

const char* error_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 413:
      return "invalid_request_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param);
}

// Reads optional fields of one body; every accessor checks the JSON type.
class Fields {
 public:
  explicit Fields(const Json& body) : body_(body) {}

  const Json* get(const char* key) const {
    auto it = body_.find(key);
    return it == body_.end() || it->is_null() ? nullptr : &*it;
  }
  double number(const char* key, double def, double lo, double hi) const {
    const Json* v = get(key);
    if (!v) return def;
    if (!v->is_number()) bad(key, std::string("'") + key + "' must be a number");
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi)
      bad(key, std::string("'") + key + "' must be between " + fmt(lo) + " and " + fmt(hi));
    return x;
  }
  int64_t integer(const char* key, int64_t def, int64_t lo, int64_t hi) const {
    const Json* v = get(key);
    if (!v) return def;
    if (!v->is_number_integer()) bad(key, std::string("'") + key + "' must be an integer");
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi))
      bad(key, std::string("'") + key + "' must be at most " + std::to_string(hi));
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi)
      bad(key, std::string("'") + key + "' must be between " + std::to_string(lo) + " and " +
                   std::to_string(hi));
    return x;
  }
  bool boolean(const char* key, bool def) const {
    const Json* v = get(key);
    if (!v) return def;
    if (!v->is_boolean()) bad(key, std::string("'") + key + "' must be a boolean");
    return v->get<bool>();
  }

 private:
  static std::string fmt(double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", x);
    return buf;
  }
  const Json& body_;
};

void check_model(const Json& body, const ModelContext& ctx) {
  auto it = body.find("model");
  if (it == body.end() || it->is_null()) return;  // optional: there is one model
  if (!it->is_string()) bad("model", "'model' must be a string");
  const std::string& m = it->get_ref<const std::string&>();
  if (m != ctx.name && m != "gyre")
    throw ApiError(404,
                   "The model '" + m + "' does not exist; this server serves '" + ctx.name + "'",
                   "model", "model_not_found");
}

std::vector<std::string> stop_strings(const Fields& f) {
  const Json* v = f.get("stop");
  if (!v) return {};
  if (v->is_string()) return {v->get<std::string>()};
  if (!v->is_array() || v->size() > 16)
    bad("stop", "'stop' must be a string or an array of at most 16 strings");
  std::vector<std::string> out;
  for (const Json& s : *v) {
    if (!s.is_string()) bad("stop", "'stop' must contain strings only");
    if (!s.get_ref<const std::string&>().empty()) out.push_back(s.get<std::string>());
  }
  return out;
}

// Fields shared by both endpoints: sampling, stop, n, stream.
ParsedRequest common_fields(const Json& body, const ModelContext& ctx, int default_max_tokens) {
  if (!body.is_object()) bad("", "The request body must be a JSON object");
  check_model(body, ctx);
  Fields f(body);
  ParsedRequest r;
  GenerationSettings& g = r.options.gen;
  int64_t max_tokens = f.integer("max_tokens", default_max_tokens, 0, 1 << 30);
  if (f.get("max_completion_tokens"))
    max_tokens = f.integer("max_completion_tokens", default_max_tokens, 0, 1 << 30);
  if (f.get("max_tokens") && max_tokens < 1) bad("max_tokens", "'max_tokens' must be at least 1");
  g.max_tokens = static_cast<int>(max_tokens);
  g.stop_strings = stop_strings(f);
  g.ignore_eos = f.boolean("ignore_eos", false);  // an extension, as in vLLM
  SamplerSettings& s = g.sampler;
  // OpenAI's defaults: temperature 1, no truncation.
  s.temperature = static_cast<float>(f.number("temperature", 1.0, 0.0, 2.0));
  s.top_p = static_cast<float>(f.number("top_p", 1.0, 0.0, 1.0));
  if (s.top_p <= 0) bad("top_p", "'top_p' must be greater than 0");
  const int64_t top_k = f.integer("top_k", 0, -1, 1 << 30);
  s.top_k = top_k < 0 ? 0 : static_cast<int>(top_k);  // -1 means off, as in vLLM
  s.min_p = static_cast<float>(f.number("min_p", 0.0, 0.0, 1.0));
  s.typical_p = static_cast<float>(f.number("typical_p", 1.0, 0.0, 1.0));
  if (s.typical_p <= 0) bad("typical_p", "'typical_p' must be greater than 0");
  s.presence_penalty = static_cast<float>(f.number("presence_penalty", 0.0, -2.0, 2.0));
  s.frequency_penalty = static_cast<float>(f.number("frequency_penalty", 0.0, -2.0, 2.0));
  s.repetition_penalty = static_cast<float>(f.number("repetition_penalty", 1.0, 0.0, 100.0));
  if (s.repetition_penalty <= 0)
    bad("repetition_penalty", "'repetition_penalty' must be greater than 0");
  if (const Json* seed = f.get("seed")) {
    if (!seed->is_number_integer()) bad("seed", "'seed' must be an integer");
    s.seed = seed->is_number_unsigned() ? seed->get<uint64_t>()
                                        : static_cast<uint64_t>(seed->get<int64_t>());
  } else {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    s.seed = rng();
  }
  try {
    s.validate();
  } catch (const Error& e) {
    bad("", e.what());
  }
  r.n = static_cast<int>(f.integer("n", 1, 1, kMaxChoices));
  r.stream = f.boolean("stream", false);
  if (const Json* so = f.get("stream_options")) {
    if (!so->is_object()) bad("stream_options", "'stream_options' must be an object");
    r.include_usage = Fields(*so).boolean("include_usage", false);
  }
  return r;
}

void check_prompt(ParsedRequest& r, const ModelContext& ctx, const char* param) {
  if (r.prompt_ids.empty()) bad(param, "The prompt is empty");
  const int vocab = ctx.tokenizer->vocab_size();
  for (int id : r.prompt_ids)
    if (id < 0 || id >= vocab)
      bad(param, "Token id " + std::to_string(id) + " is outside the vocabulary of " +
                     std::to_string(vocab));
  if (static_cast<int64_t>(r.prompt_ids.size()) >= ctx.max_seq_len)
    throw ApiError(413,
                   "The prompt has " + std::to_string(r.prompt_ids.size()) +
                       " tokens; this server's context is " + std::to_string(ctx.max_seq_len) +
                       " tokens",
                   param, "context_length_exceeded");
}

// Chat message content: a string, null, or text parts (joined).
Json flatten_content(const Json& content) {
  if (content.is_string() || content.is_null()) return content;
  if (!content.is_array()) bad("messages", "message content must be a string or an array");
  std::string text;
  for (const Json& part : content) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string())
      bad("messages", "only text content parts are supported");
    text += part["text"].get<std::string>();
  }
  return text;
}

}  // namespace

ApiError::ApiError(int status, std::string message, std::string param, std::string code)
    : std::runtime_error(std::move(message)),
      status_(status),
      type_(error_type(status)),
      param_(std::move(param)),
      code_(std::move(code)) {}

Json error_body(int status, const std::string& message, const std::string& param,
                const std::string& code) {
  return {{"error",
           {{"message", message},
            {"type", error_type(status)},
            {"param", param.empty() ? Json() : Json(param)},
            {"code", code.empty() ? Json() : Json(code)}}}};
}

Json parse_body(const std::string& body) {
  try {
    return Json::parse(body);
  } catch (const nlohmann::json::exception& e) {
    throw ApiError(400, std::string("The body is not valid JSON: ") + e.what(), "", "invalid_json");
  }
}

ParsedRequest parse_completion_request(const Json& body, const ModelContext& ctx) {
  ParsedRequest r = common_fields(body, ctx, 16);
  Fields f(body);
  const int64_t logprobs = f.integer("logprobs", -1, 0, kMaxLogprobs);
  if (logprobs >= 0) {
    r.logprobs = r.options.logprobs = true;
    r.options.top_logprobs = static_cast<int>(logprobs);
  }
  const Json* prompt = f.get("prompt");
  if (!prompt) bad("prompt", "'prompt' is required");
  // A one-element list stands for its element (clients send either).
  if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) prompt = &(*prompt)[0];
  if (prompt->is_string()) {
    r.prompt_ids = ctx.tokenizer->encode(prompt->get_ref<const std::string&>(), true);
  } else if (prompt->is_array()) {
    for (const Json& id : *prompt) {
      if (!id.is_number_integer())
        bad("prompt", "'prompt' must be a string or an array of token ids (one prompt only)");
      const int64_t v = id.get<int64_t>();
      r.prompt_ids.push_back(v < INT32_MIN || v > INT32_MAX ? -1 : static_cast<int>(v));
    }
  } else {
    bad("prompt", "'prompt' must be a string or an array of token ids");
  }
  check_prompt(r, ctx, "prompt");
  return r;
}

ParsedRequest parse_chat_request(const Json& body, const ModelContext& ctx) {
  // Chat replies run until EOS or the context is full unless max_tokens says otherwise.
  ParsedRequest r = common_fields(body, ctx, 0);
  r.chat = true;
  Fields f(body);
  r.logprobs = r.options.logprobs = f.boolean("logprobs", false);
  r.options.top_logprobs = static_cast<int>(f.integer("top_logprobs", 0, 0, kMaxLogprobs));
  if (r.options.top_logprobs > 0 && !r.logprobs)
    bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  const Json* messages = f.get("messages");
  if (!messages || !messages->is_array() || messages->empty())
    bad("messages", "'messages' must be a non-empty array");
  Json msgs = Json::array();
  for (const Json& m : *messages) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      bad("messages", "each message must be an object with a string 'role'");
    Json copy = m;
    if (m.contains("content")) copy["content"] = flatten_content(m["content"]);
    msgs.push_back(std::move(copy));
  }
  if (ctx.chat_template.empty())
    bad("messages", "The model '" + ctx.name + "' has no chat template; use /v1/completions");
  Json extra = Json::object();
  if (const Json* tools = f.get("tools")) {
    if (!tools->is_array()) bad("tools", "'tools' must be an array");
    extra["tools"] = *tools;
  }
  std::string text;
  try {
    text = render_chat_template_ordered(ctx.chat_template, msgs, true, ctx.bos_token, ctx.eos_token,
                                        extra);
  } catch (const Error& e) {
    bad("messages", std::string("The chat template failed: ") + e.what());
  }
  r.prompt_ids = ctx.tokenizer->encode(text, false);
  for (int id : ctx.end_of_turn_ids) r.options.gen.stop_ids.push_back(id);
  check_prompt(r, ctx, "messages");
  return r;
}

}  // namespace gyre
