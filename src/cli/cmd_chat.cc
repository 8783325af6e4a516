// gyre chat: an interactive conversation. Each turn renders the whole conversation with the
// model's own chat template; the generator reuses the KV cache for the unchanged prefix.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "tokenizer/chat_template.h"

namespace gyre {

namespace {

struct ChatOptions {
  ModelOptions model;
  std::string system;
  GenerationSettings gen;
  bool seed_given = false;
  bool stats = false;
};

// Tokens that close an assistant turn in common templates; they end a reply even when the
// config's EOS list leaves them out.
std::vector<int> end_of_turn_ids(const Tokenizer& tok) {
  std::vector<int> ids;
  for (const char* t : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "</s>"}) {
    const int id = tok.token_to_id(t);
    if (id >= 0 && tok.is_special(id)) ids.push_back(id);
  }
  return ids;
}

std::string token_text(const Tokenizer& tok, int id) {
  return id >= 0 && id < tok.vocab_size() ? tok.id_to_token(id) : std::string();
}

void chat(ChatOptions& o) {
  finish_sampler_settings(o.gen.sampler, o.seed_given);
  auto model = load_model(o.model.model);
  GYRE_CHECK(!model->chat_template.empty(), "'", o.model.model,
             "' has no chat template (chat_template in tokenizer_config.json, or "
             "tokenizer.chat_template in a GGUF file); gyre chat renders the model's own Jinja "
             "template (e.g. Llama 2/3, Mistral, Qwen2 or SmolLM2 chat models), so use an "
             "instruct/chat model, or gyre run for plain completion");
  const int max_seq = context_length(model->config, o.model.max_seq_len);
  Engine e = open_engine(std::move(model), o.model, max_seq);
  const Tokenizer& tok = *e.model->tokenizer;
  const std::string& tmpl = e.model->chat_template;
  const std::string bos = token_text(tok, tok.bos_id());
  std::vector<int> eos_ids = tok.eos_ids();
  if (eos_ids.empty()) eos_ids = e.model->config.eos_ids;
  const std::string eos = eos_ids.empty() ? std::string() : token_text(tok, eos_ids[0]);
  for (int id : end_of_turn_ids(tok)) o.gen.stop_ids.push_back(id);

  nlohmann::json messages = nlohmann::json::array();
  if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
  // Render once up front so an unsupported template fails before the first question.
  render_chat_template(tmpl, messages, true, bos, eos);

  Generator gen(*e.transformer, tok);
  const bool interactive = isatty(STDIN_FILENO);
  if (interactive)
    std::fprintf(stderr, "gyre: chat ready; /reset clears the conversation, /exit or EOF ends\n");
  std::string line;
  for (;;) {
    if (interactive) std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line) || line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      messages.erase(messages.begin() + (o.system.empty() ? 0 : 1), messages.end());
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    const std::string prompt = render_chat_template(tmpl, messages, true, bos, eos);
    // The template writes BOS and the other special tokens itself.
    const std::vector<int> ids = tok.encode(prompt, false);
    try {
      Generator::check_prompt(ids, max_seq, e.model->config.vocab_size);
    } catch (const Error& err) {
      std::fprintf(stderr, "gyre: %s; /reset to start over\n", err.what());
      messages.erase(messages.end() - 1);
      continue;
    }
    const GenerationResult r = gen.generate_ids(ids, o.gen, [](std::string_view t) {
      std::fwrite(t.data(), 1, t.size(), stdout);
      std::fflush(stdout);
    });
    std::printf("\n");
    std::fflush(stdout);
    if (o.stats) std::fprintf(stderr, "%s\n", stats_line(r).c_str());
    messages.push_back({{"role", "assistant"}, {"content", r.text}});
  }
}

}  // namespace

void add_chat_command(CLI::App& app) {
  auto o = std::make_shared<ChatOptions>();
  o->gen.max_tokens = 1024;
  CLI::App* cmd = app.add_subcommand(
      "chat",
      "Chat with an instruct model: reads one user message per stdin line, streams each reply "
      "to stdout. Uses the model's chat template. Sampling defaults: --temp 0.8 --top-p 0.95.");
  add_model_option(*cmd, o->model);
  cmd->add_option("--system", o->system, "System message");
  cmd->add_option("-n,--max-tokens", o->gen.max_tokens,
                  "Tokens per reply at most (<= 0: until end of turn or the context is full)")
      ->capture_default_str();
  add_sampling_options(*cmd, o->gen.sampler, o->seed_given);
  add_generation_options(*cmd, o->gen);
  cmd->add_flag("--stats", o->stats, "Print a stats line on stderr after each reply");
  add_runtime_options(*cmd, o->model);
  cmd->callback([o] { chat(*o); });
}

}  // namespace gyre
