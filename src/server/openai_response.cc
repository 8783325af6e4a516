#include "server/openai_response.h"

namespace gyre {

namespace {

using Json = nlohmann::ordered_json;

// The text a token stands for alone (a piece of a UTF-8 character may be invalid: dump_json
// repairs it).
std::string token_string(const Tokenizer& tok, int id) {
  return tok.decode({id}, false);
}

Json bytes_of(const std::string& s) {
  Json b = Json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// Completions' logprobs object: parallel arrays, top_logprobs as {token: logprob} maps.
Json completion_logprobs(const std::vector<TokenLogprob>& lps, const Tokenizer& tok,
                         size_t text_offset) {
  Json tokens = Json::array(), token_lps = Json::array(), tops = Json::array(),
       offsets = Json::array();
  for (const TokenLogprob& t : lps) {
    const std::string s = token_string(tok, t.id);
    tokens.push_back(s);
    token_lps.push_back(t.logprob);
    Json top = Json::object();
    for (const auto& [id, lp] : t.top) top[token_string(tok, id)] = lp;
    tops.push_back(std::move(top));
    offsets.push_back(text_offset);
    text_offset += s.size();
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_lps},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

// Chat's logprobs object: {"content": [{token, logprob, bytes, top_logprobs}]}.
Json chat_logprobs(const std::vector<TokenLogprob>& lps, const Tokenizer& tok) {
  Json content = Json::array();
  for (const TokenLogprob& t : lps) {
    const std::string s = token_string(tok, t.id);
    Json top = Json::array();
    for (const auto& [id, lp] : t.top) {
      const std::string ts = token_string(tok, id);
      top.push_back({{"token", ts}, {"logprob", lp}, {"bytes", bytes_of(ts)}});
    }
    content.push_back(
        {{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

}  // namespace

void ChoiceResult::add(const TokenEvent& e, bool want_logprobs) {
  text += e.text;
  if (want_logprobs && e.token >= 0) logprobs.push_back({e.token, e.logprob, e.top_logprobs});
  if (e.done) {
    done = true;
    finish = e.finish;
    error = e.error;
    prompt_tokens = e.prompt_tokens;
    completion_tokens = e.completion_tokens;
    cached_tokens = e.cached_tokens;
  }
}

const char* openai_finish_reason(FinishReason r) {
  return r == FinishReason::Length || r == FinishReason::ContextFull ? "length" : "stop";
}

Json usage_json(const std::vector<ChoiceResult>& choices) {
  const int prompt = choices.empty() ? 0 : choices[0].prompt_tokens;
  const int cached = choices.empty() ? 0 : choices[0].cached_tokens;
  int completion = 0;
  for (const ChoiceResult& c : choices) completion += c.completion_tokens;
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

Json full_response(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices,
                   const Tokenizer& tok) {
  Json out_choices = Json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    Json choice = {{"index", i}};
    if (meta.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      choice["logprobs"] = meta.logprobs ? chat_logprobs(c.logprobs, tok) : Json();
    } else {
      choice["text"] = c.text;
      choice["logprobs"] = meta.logprobs ? completion_logprobs(c.logprobs, tok, 0) : Json();
    }
    choice["finish_reason"] = openai_finish_reason(c.finish);
    out_choices.push_back(std::move(choice));
  }
  return {{"id", meta.id},           {"object", meta.chat ? "chat.completion" : "text_completion"},
          {"created", meta.created}, {"model", meta.model},
          {"choices", out_choices},  {"usage", usage_json(choices)}};
}

Json stream_chunk(const ResponseMeta& meta, int index, const std::string& text,
                  const std::vector<TokenLogprob>& logprobs, const char* finish, bool role,
                  const Tokenizer& tok) {
  Json choice = {{"index", index}};
  if (meta.chat) {
    Json delta = Json::object();
    if (role) delta["role"] = "assistant";
    if (role || !text.empty()) delta["content"] = text;
    choice["delta"] = delta;
    choice["logprobs"] = meta.logprobs && !logprobs.empty() ? chat_logprobs(logprobs, tok) : Json();
  } else {
    choice["text"] = text;
    choice["logprobs"] =
        meta.logprobs && !logprobs.empty() ? completion_logprobs(logprobs, tok, 0) : Json();
  }
  choice["finish_reason"] = finish ? Json(finish) : Json();
  return {{"id", meta.id},
          {"object", meta.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", meta.created},
          {"model", meta.model},
          {"choices", Json::array({choice})}};
}

Json usage_chunk(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices) {
  return {{"id", meta.id},
          {"object", meta.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", meta.created},
          {"model", meta.model},
          {"choices", Json::array()},
          {"usage", usage_json(choices)}};
}

std::string dump_json(const Json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string sse_event(const Json& j) {
  return "data: " + dump_json(j) + "\n\n";
}

}  // namespace gyre
