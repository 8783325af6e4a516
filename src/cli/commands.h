// Each `gyre` subcommand lives in its own cmd_<name>.cc and registers itself on the app.
// A command's callback throws gyre::Error for anything the user did wrong; main() prints it as
// one line and exits 1.
#pragma once
#include <CLI/CLI.hpp>

namespace gyre {

void add_run_command(CLI::App& app);        // cmd_run.cc
void add_chat_command(CLI::App& app);       // cmd_chat.cc
void add_tokenize_commands(CLI::App& app);  // cmd_tokenize.cc: tokenize, detokenize
void add_info_command(CLI::App& app);       // cmd_info.cc
void add_bench_command(CLI::App& app);      // cmd_bench.cc
void add_serve_command(CLI::App& app);      // cmd_serve.cc
void add_eval_commands(CLI::App& app);      // cmd_eval.cc: perplexity, kld
void add_convert_command(CLI::App& app);    // cmd_convert.cc

}  // namespace gyre
