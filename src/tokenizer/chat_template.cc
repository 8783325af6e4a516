#include "tokenizer/chat_template.h"

#include "core/error.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_eval.h"

namespace gyre {

std::string render_chat_template_ordered(const std::string& tmpl,
                                         const nlohmann::ordered_json& messages,
                                         bool add_generation_prompt, const std::string& bos_token,
                                         const std::string& eos_token,
                                         const nlohmann::ordered_json& extra_context) {
  using jinja::Value;
  GYRE_CHECK(extra_context.is_null() || extra_context.is_object(),
             "chat template: extra context must be a JSON object");
  const jinja::Body body = jinja::parse_template(tmpl);
  Value vars = Value::new_dict();
  vars.dict->set("messages", Value::from_json(messages));
  vars.dict->set("add_generation_prompt", Value::from_bool(add_generation_prompt));
  vars.dict->set("bos_token", Value::from_string(bos_token));
  vars.dict->set("eos_token", Value::from_string(eos_token));
  // transformers always passes these two, as None when the caller has none.
  vars.dict->set("tools", Value::none());
  vars.dict->set("documents", Value::none());
  if (extra_context.is_object())
    for (const auto& [key, value] : extra_context.items())
      vars.dict->set(key, Value::from_json(value));
  return jinja::render(body, vars);
}

std::string render_chat_template(const std::string& tmpl, const nlohmann::json& messages,
                                 bool add_generation_prompt, const std::string& bos_token,
                                 const std::string& eos_token,
                                 const nlohmann::json& extra_context) {
  // nlohmann::json keeps keys sorted, so the ordered copy is sorted too.
  return render_chat_template_ordered(tmpl, nlohmann::ordered_json::parse(messages.dump()),
                                      add_generation_prompt, bos_token, eos_token,
                                      nlohmann::ordered_json::parse(extra_context.dump()));
}

std::string render_chat_template(const std::string& tmpl, const nlohmann::json& messages,
                                 bool add_generation_prompt, const std::string& bos_token,
                                 const std::string& eos_token) {
  return render_chat_template(tmpl, messages, add_generation_prompt, bos_token, eos_token,
                              nlohmann::json());
}

}  // namespace gyre
