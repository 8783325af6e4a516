#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"gyre: fast inference for Llama-family language models", "gyre"};
  app.require_subcommand(1);
  gyre::add_run_command(app);
  gyre::add_chat_command(app);
  gyre::add_tokenize_commands(app);
  gyre::add_info_command(app);
  gyre::add_bench_command(app);
  gyre::add_serve_command(app);
  gyre::add_eval_commands(app);
  gyre::add_convert_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Usage mistakes follow the same one-line rule as every other error.
    std::fprintf(stderr, "gyre: error: %s (see --help)\n", e.what());
    return 1;
  } catch (const gyre::Error& e) {
    std::fprintf(stderr, "gyre: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "gyre: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gyre: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
