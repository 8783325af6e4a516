// Chat templates: renders a Hugging Face chat template (Jinja) the way transformers'
// apply_chat_template does with Python's jinja2 (trim_blocks, lstrip_blocks, loop controls,
// raise_exception, strftime_now, tojson with ensure_ascii=False and insertion-ordered keys).
// The engine lives in jinja_*.{h,cc}. Every failure, including raise_exception(msg) (whose
// message is exactly msg), unsupported constructs and resource caps, is a gyre::Error.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace gyre {

// The variables are: messages, add_generation_prompt, bos_token, eos_token, tools and documents
// (None unless given), then every key of extra_context (an object; null means none), which
// may override the others: tools, date_string, custom_tools, builtin_tools, ...
std::string render_chat_template(const std::string& tmpl, const nlohmann::json& messages,
                                 bool add_generation_prompt, const std::string& bos_token,
                                 const std::string& eos_token);
std::string render_chat_template(const std::string& tmpl, const nlohmann::json& messages,
                                 bool add_generation_prompt, const std::string& bos_token,
                                 const std::string& eos_token, const nlohmann::json& extra_context);
// Same, for callers that parsed their JSON with nlohmann::ordered_json: dict keys then keep
// their order as in Python (nlohmann::json sorts them), which tojson and `for k, v in d|items`
// make visible.
std::string render_chat_template_ordered(const std::string& tmpl,
                                         const nlohmann::ordered_json& messages,
                                         bool add_generation_prompt, const std::string& bos_token,
                                         const std::string& eos_token,
                                         const nlohmann::ordered_json& extra_context);

}  // namespace gyre
