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

void chat(ChatOptions& o) {
  finish_sampler_settings(o.gen.sampler, o.seed_given);
  auto model = load_model(o.model.model);
  const ChatFormat fmt = chat_format(*model, o.model.model);
  const int max_seq = context_length(model->config, o.model.max_seq_len);
  OpenedModel e = open_model(std::move(model), o.model, max_seq);
  const Tokenizer& tok = *e.model->tokenizer;
  for (int id : fmt.end_of_turn) o.gen.stop_ids.push_back(id);

  nlohmann::json messages = nlohmann::json::array();
  if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
  // Render once up front so an unsupported template fails before the first question.
  chat_prompt_ids(*e.model, fmt, messages);

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
    const std::vector<int> ids = chat_prompt_ids(*e.model, fmt, messages);
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
