// gyre tokenize / gyre detokenize: the tokenizer alone, no weights loaded.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "model/loader.h"

namespace gyre {

namespace {

struct TokenizeOptions {
  std::string model;
  std::string text;
  bool no_special = false;
};

struct DetokenizeOptions {
  std::string model;
  std::vector<int> ids;
  bool skip_special = false;
};

void tokenize(const TokenizeOptions& o) {
  auto tok = load_tokenizer(o.model);
  const std::vector<int> ids = tok->encode(o.text, !o.no_special);
  std::printf("%s\n", nlohmann::json(ids).dump().c_str());
}

void detokenize(const DetokenizeOptions& o) {
  auto tok = load_tokenizer(o.model);
  for (int id : o.ids)
    GYRE_CHECK(id >= 0 && id < tok->vocab_size(), "token id ", id, " is outside the vocabulary of ",
               tok->vocab_size());
  const std::string text = tok->decode(o.ids, o.skip_special);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::printf("\n");
}

const char* kModelHelp =
    "Tokenizer source: a model folder, a folder with tokenizer.json (and optionally "
    "tokenizer_config.json), or a .gguf file";

}  // namespace

void add_tokenize_commands(CLI::App& app) {
  auto t = std::make_shared<TokenizeOptions>();
  CLI::App* tc = app.add_subcommand("tokenize", "Print the token ids of a text as a JSON array");
  tc->add_option("-m,--model", t->model, kModelHelp)->required();
  tc->add_option("--text", t->text, "Text to encode")->required();
  tc->add_flag("--no-special", t->no_special,
               "Do not add BOS/EOS (special-token strings in the text are still matched)");
  tc->callback([t] { tokenize(*t); });

  auto d = std::make_shared<DetokenizeOptions>();
  CLI::App* dc = app.add_subcommand("detokenize", "Print the text of token ids");
  dc->add_option("-m,--model", d->model, kModelHelp)->required();
  dc->add_option("ids", d->ids, "Token ids")->required();
  dc->add_flag("--skip-special", d->skip_special, "Leave out control tokens such as BOS/EOS");
  dc->callback([d] { detokenize(*d); });
}

}  // namespace gyre
