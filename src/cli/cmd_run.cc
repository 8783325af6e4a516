// gyre run: one completion of a prompt, streamed to stdout (or one JSON object with --json).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"

namespace gyre {

namespace {

struct RunOptions {
  ModelOptions model;
  std::string prompt;
  GenerationSettings gen;
  bool seed_given = false;
  bool json = false;
  bool chat = false;
  std::string system;
};

nlohmann::ordered_json result_json(const GenerationResult& r, uint64_t seed) {
  const GenerationStats& s = r.stats;
  return {{"prompt_tokens", r.prompt_ids},
          {"tokens", r.tokens},
          {"text", r.text},
          {"finish_reason", finish_reason_name(r.finish)},
          {"stats",
           {{"prompt_tokens", s.prompt_tokens},
            {"generated_tokens", s.generated_tokens},
            {"prefill_s", s.prefill_s},
            {"prefill_tok_s", s.prefill_tok_s},
            {"decode_s", s.decode_s},
            {"decode_tok_s", s.decode_tok_s},
            {"seed", seed}}}};
}

void run(RunOptions& o) {
  finish_sampler_settings(o.gen.sampler, o.seed_given);
  auto model = load_model(o.model.model);
  const int max_seq = context_length(model->config, o.model.max_seq_len);
  // Check the prompt before the (possibly slow) upload so a bad prompt fails fast.
  std::vector<int> prompt_ids;
  if (o.chat) {
    const ChatFormat fmt = chat_format(*model, o.model.model);
    nlohmann::json messages = nlohmann::json::array();
    if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
    messages.push_back({{"role", "user"}, {"content", o.prompt}});
    prompt_ids = chat_prompt_ids(*model, fmt, messages);
    for (int id : fmt.end_of_turn) o.gen.stop_ids.push_back(id);
  } else {
    prompt_ids = model->tokenizer->encode(o.prompt, true);
  }
  Generator::check_prompt(prompt_ids, max_seq, model->config.vocab_size);

  OpenedModel e = open_model(std::move(model), o.model, max_seq);
  Generator gen(*e.transformer, *e.model->tokenizer);
  TextCallback stream;
  if (!o.json)
    stream = [](std::string_view t) {
      std::fwrite(t.data(), 1, t.size(), stdout);
      std::fflush(stdout);
    };
  const GenerationResult r = gen.generate_ids(prompt_ids, o.gen, stream);
  if (o.json) {
    const std::string out = result_json(r, o.gen.sampler.seed)
                                .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    std::printf("%s\n", out.c_str());
  } else if (r.text.empty() || r.text.back() != '\n') {
    std::printf("\n");
  }
  std::fflush(stdout);
  std::fprintf(stderr, "%s\n", stats_line(r).c_str());
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand(
      "run",
      "Complete a prompt. The continuation streams to stdout, then one stats line goes to "
      "stderr. Sampling defaults: --temp 0.8 --top-p 0.95; use --temp 0 for greedy decoding.");
  add_model_option(*cmd, o->model);
  cmd->add_option("-p,--prompt", o->prompt, "Prompt text (BOS is added as the tokenizer says)")
      ->required();
  cmd->add_option("-n,--max-tokens", o->gen.max_tokens,
                  "Tokens to generate at most (<= 0: until EOS or the context is full)")
      ->capture_default_str();
  add_sampling_options(*cmd, o->gen.sampler, o->seed_given);
  add_generation_options(*cmd, o->gen);
  cmd->add_flag("--json", o->json,
                "Print one JSON object (prompt_tokens, tokens, text, finish_reason, stats) "
                "instead of streaming");
  cmd->add_flag("--chat", o->chat,
                "Treat the prompt as a user message: render it with the model's chat template "
                "and stop at the end of the assistant's turn");
  cmd->add_option("--system", o->system, "System message (with --chat)");
  add_runtime_options(*cmd, o->model);
  cmd->callback([o] { run(*o); });
}

}  // namespace gyre
