// Tokenizer::from_hf / from_folder: tokenizer.json (+ tokenizer_config.json) -> TokenizerSpec.
// Only the component types the supported model families use are accepted; anything else is a
// clear gyre::Error rather than a silently different tokenization.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace gyre {
namespace tok {
namespace {

using nlohmann::json;

// Ids beyond this are surely corrupt and would only make us allocate a huge table.
constexpr int64_t kMaxVocab = 1 << 21;
// nlohmann parses iteratively, but a sane tokenizer.json is shallow; refuse absurd nesting early.
constexpr int kMaxDepth = 64;

void check_depth(const std::string& text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      GYRE_CHECK(++depth <= kMaxDepth, "tokenizer.json: nesting deeper than ", kMaxDepth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

bool get_bool(const json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  GYRE_CHECK(it->is_boolean(), "tokenizer.json: '", key, "' must be true or false");
  return it->get<bool>();
}

std::string get_string(const json& j, const char* key) {
  auto it = j.find(key);
  GYRE_CHECK(it != j.end() && it->is_string(), "tokenizer.json: missing string '", key, "'");
  return it->get<std::string>();
}

std::string type_of(const json& j) {
  GYRE_CHECK(j.is_object(), "tokenizer.json: expected an object with a 'type'");
  return get_string(j, "type");
}

// {"String": s} or {"Regex": r}: a literal string, or a regex when regex_ok.
struct Pattern {
  std::string text;
  bool is_regex;
};
Pattern get_pattern(const json& j) {
  auto it = j.find("pattern");
  GYRE_CHECK(it != j.end() && it->is_object(), "tokenizer.json: missing 'pattern'");
  if (it->contains("Regex")) return {get_string(*it, "Regex"), true};
  return {get_string(*it, "String"), false};
}

std::string escape_regex(const std::string& literal) {
  std::string out;
  for (char c : literal) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) out += '\\';
    out += c;
  }
  return out;
}

// Grows the vocabulary table so `id` fits, and records `token` for it.
void set_token(TokenizerSpec& spec, int64_t id, const std::string& token) {
  GYRE_CHECK(id >= 0 && id < kMaxVocab, "tokenizer.json: token id ", id, " out of range");
  if (static_cast<size_t>(id) >= spec.id_to_token.size()) spec.id_to_token.resize(id + 1);
  spec.id_to_token[id] = token;
  spec.token_to_id.emplace(token, static_cast<int>(id));
}

int require_id(const TokenizerSpec& spec, const std::string& token, const char* what) {
  auto it = spec.token_to_id.find(token);
  GYRE_CHECK(it != spec.token_to_id.end(), "tokenizer.json: ", what, " '", token,
             "' is not in the vocabulary");
  return it->second;
}

void parse_model(const json& model, TokenizerSpec& spec) {
  GYRE_CHECK(model.is_object(), "tokenizer.json: 'model' must be an object");
  if (model.contains("type")) {
    const std::string type = type_of(model);
    GYRE_CHECK(type == "BPE", "tokenizer.json: unsupported model type '", type,
               "' (only BPE is supported)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(key);
    GYRE_CHECK(
        it == model.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty()),
        "tokenizer.json: BPE '", key, "' is not supported");
  }
  auto vocab = model.find("vocab");
  GYRE_CHECK(vocab != model.end() && vocab->is_object(), "tokenizer.json: model.vocab missing");
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    GYRE_CHECK(it.value().is_number_integer(), "tokenizer.json: vocab id of '", it.key(),
               "' is not an integer");
    set_token(spec, it.value().get<int64_t>(), it.key());
  }
  spec.byte_fallback = get_bool(model, "byte_fallback", false);
  spec.fuse_unk = get_bool(model, "fuse_unk", false);
  spec.ignore_merges = get_bool(model, "ignore_merges", false);
  auto unk = model.find("unk_token");
  if (unk != model.end() && !unk->is_null()) {
    GYRE_CHECK(unk->is_string(), "tokenizer.json: model.unk_token must be a string");
    auto id = spec.token_to_id.find(unk->get<std::string>());
    if (id != spec.token_to_id.end()) spec.unk_id = id->second;
  }
  auto merges = model.find("merges");
  GYRE_CHECK(merges != model.end() && merges->is_array(), "tokenizer.json: model.merges missing");
  int rank = 0;
  for (const json& m : *merges) {
    std::string left, right;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ', 1);
      GYRE_CHECK(space != std::string::npos && space + 1 < s.size(), "tokenizer.json: merge '", s,
                 "' is not two tokens separated by a space");
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else {
      GYRE_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
                 "tokenizer.json: a merge must be \"a b\" or [\"a\", \"b\"]");
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    }
    const int a = require_id(spec, left, "merge part");
    const int b = require_id(spec, right, "merge part");
    const int merged = require_id(spec, left + right, "merge result");
    const uint64_t key = (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b);
    spec.merges.emplace(key, MergeRule{rank++, merged});  // the first (lowest rank) wins
  }
}

void parse_added_tokens(const json& j, TokenizerSpec& spec) {
  if (j.is_null()) return;
  GYRE_CHECK(j.is_array(), "tokenizer.json: 'added_tokens' must be an array");
  for (const json& t : j) {
    GYRE_CHECK(t.is_object() && t.contains("id") && t["id"].is_number_integer(),
               "tokenizer.json: an added token lacks an integer 'id'");
    AddedToken a;
    a.content = get_string(t, "content");
    a.id = static_cast<int>(std::clamp<int64_t>(t["id"].get<int64_t>(), -1, kMaxVocab));
    a.special = get_bool(t, "special", false);
    a.lstrip = get_bool(t, "lstrip", false);
    a.rstrip = get_bool(t, "rstrip", false);
    a.single_word = get_bool(t, "single_word", false);
    GYRE_CHECK(!a.content.empty(), "tokenizer.json: an added token is empty");
    set_token(spec, a.id, a.content);
    spec.token_to_id[a.content] = a.id;  // an added token's own id wins over the model's
    if (spec.special.size() < spec.id_to_token.size()) spec.special.resize(spec.id_to_token.size());
    spec.special[a.id] = a.special;
    spec.added.push_back(std::move(a));
  }
}

void parse_normalizer(const json& j, TokenizerSpec& spec) {
  if (j.is_null()) return;
  const std::string type = type_of(j);
  if (type == "Sequence") {
    auto list = j.find("normalizers");
    GYRE_CHECK(list != j.end() && list->is_array(),
               "tokenizer.json: normalizer Sequence lacks a list");
    for (const json& n : *list) parse_normalizer(n, spec);
  } else if (type == "Prepend") {
    spec.normalizer.push_back({true, "", get_string(j, "prepend")});
  } else if (type == "Replace") {
    const Pattern p = get_pattern(j);
    GYRE_CHECK(!p.is_regex, "tokenizer.json: regex Replace normalizers are not supported");
    spec.normalizer.push_back({false, p.text, get_string(j, "content")});
  } else if (type == "NFC") {
    // Not implemented: NFC leaves already-composed text (nearly all real input) unchanged.
  } else {
    fail("tokenizer.json: unsupported normalizer '", type, "'");
  }
}

PrependScheme metaspace_scheme(const json& j) {
  if (j.contains("prepend_scheme")) {
    const std::string s = get_string(j, "prepend_scheme");
    if (s == "always") return PrependScheme::kAlways;
    if (s == "first") return PrependScheme::kFirst;
    if (s == "never") return PrependScheme::kNever;
    fail("tokenizer.json: unknown Metaspace prepend_scheme '", s, "'");
  }
  return get_bool(j, "add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
}

void parse_pre_tokenizer(const json& j, TokenizerSpec& spec) {
  if (j.is_null()) return;
  const std::string type = type_of(j);
  if (type == "Sequence") {
    auto list = j.find("pretokenizers");
    GYRE_CHECK(list != j.end() && list->is_array(),
               "tokenizer.json: pre_tokenizer Sequence lacks a list");
    for (const json& p : *list) parse_pre_tokenizer(p, spec);
  } else if (type == "Split") {
    const Pattern p = get_pattern(j);
    const std::string behavior = j.value("behavior", std::string("Isolated"));
    GYRE_CHECK(behavior == "Isolated" && !get_bool(j, "invert", false),
               "tokenizer.json: only Isolated, non-inverted Split pre-tokenizers are supported");
    spec.split_patterns.push_back(p.is_regex ? p.text : escape_regex(p.text));
  } else if (type == "ByteLevel") {
    spec.byte_level = true;
    spec.byte_level_prefix_space = get_bool(j, "add_prefix_space", false);
    if (get_bool(j, "use_regex", true)) spec.split_patterns.push_back(kGpt2Pattern);
  } else if (type == "Digits") {
    spec.split_patterns.push_back(get_bool(j, "individual_digits", false) ? R"(\p{N})"
                                                                          : R"(\p{N}+)");
  } else if (type == "Metaspace") {
    spec.metaspace = true;
    spec.metaspace_char = j.value("replacement", std::string("\xE2\x96\x81"));
    spec.metaspace_prepend = metaspace_scheme(j);
    spec.metaspace_split = get_bool(j, "split", true);
  } else {
    fail("tokenizer.json: unsupported pre_tokenizer '", type, "'");
  }
}

std::vector<int> special_ids(const json& specials, const std::string& name) {
  auto it = specials.find(name);
  GYRE_CHECK(
      it != specials.end() && it->is_object() && it->contains("ids") && (*it)["ids"].is_array(),
      "tokenizer.json: TemplateProcessing special token '", name, "' is not defined");
  std::vector<int> ids;
  for (const json& id : (*it)["ids"]) {
    GYRE_CHECK(id.is_number_integer(), "tokenizer.json: TemplateProcessing id is not an integer");
    ids.push_back(static_cast<int>(std::clamp<int64_t>(id.get<int64_t>(), -1, kMaxVocab)));
  }
  return ids;
}

void parse_post_processor(const json& j, TokenizerSpec& spec) {
  if (j.is_null()) return;
  const std::string type = type_of(j);
  if (type == "Sequence") {
    auto list = j.find("processors");
    GYRE_CHECK(list != j.end() && list->is_array(),
               "tokenizer.json: post_processor Sequence lacks a list");
    for (const json& p : *list) parse_post_processor(p, spec);
  } else if (type == "ByteLevel") {
    // Only adjusts offsets; adds no tokens.
  } else if (type == "TemplateProcessing") {
    auto single = j.find("single");
    GYRE_CHECK(single != j.end() && single->is_array(),
               "tokenizer.json: TemplateProcessing lacks 'single'");
    const json specials = j.value("special_tokens", json::object());
    bool after_sequence = false;
    spec.prefix_ids.clear();
    spec.suffix_ids.clear();
    for (const json& piece : *single) {
      GYRE_CHECK(piece.is_object(), "tokenizer.json: bad TemplateProcessing piece");
      if (piece.contains("Sequence")) {
        after_sequence = true;
      } else if (piece.contains("SpecialToken")) {
        const auto ids = special_ids(specials, get_string(piece["SpecialToken"], "id"));
        auto& target = after_sequence ? spec.suffix_ids : spec.prefix_ids;
        target.insert(target.end(), ids.begin(), ids.end());
      } else {
        fail("tokenizer.json: bad TemplateProcessing piece");
      }
    }
  } else {
    fail("tokenizer.json: unsupported post_processor '", type, "'");
  }
}

void parse_decoder(const json& j, TokenizerSpec& spec) {
  if (j.is_null()) return;
  const std::string type = type_of(j);
  DecoderStep step{};
  if (type == "Sequence") {
    auto list = j.find("decoders");
    GYRE_CHECK(list != j.end() && list->is_array(),
               "tokenizer.json: decoder Sequence lacks a list");
    for (const json& d : *list) parse_decoder(d, spec);
    return;
  } else if (type == "ByteLevel") {
    step.kind = DecodeStep::kByteLevel;
  } else if (type == "Replace") {
    const Pattern p = get_pattern(j);
    GYRE_CHECK(!p.is_regex, "tokenizer.json: regex Replace decoders are not supported");
    step.kind = DecodeStep::kReplace;
    step.from = p.text;
    step.to = get_string(j, "content");
  } else if (type == "ByteFallback") {
    step.kind = DecodeStep::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecodeStep::kFuse;
  } else if (type == "Strip") {
    step.kind = DecodeStep::kStrip;
    step.strip_char = get_string(j, "content");
    const auto count = [&](const char* key) {
      auto it = j.find(key);
      GYRE_CHECK(it != j.end() && it->is_number_integer(), "tokenizer.json: Strip lacks '", key,
                 "'");
      return static_cast<int>(std::clamp<int64_t>(it->get<int64_t>(), 0, 1 << 20));
    };
    step.strip_start = count("start");
    step.strip_stop = count("stop");
  } else if (type == "Metaspace") {
    step.kind = DecodeStep::kMetaspace;
    step.from = j.value("replacement", std::string("\xE2\x96\x81"));
    step.metaspace_strip_first = metaspace_scheme(j) != PrependScheme::kNever;
  } else {
    fail("tokenizer.json: unsupported decoder '", type, "'");
  }
  spec.decoder.push_back(std::move(step));
}

// bos_token / eos_token in tokenizer_config.json: a string or {"content": ...}.
int config_token_id(const json& config, const char* key, const TokenizerSpec& spec) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return -1;
  std::string content;
  if (it->is_string())
    content = it->get<std::string>();
  else if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    content = (*it)["content"].get<std::string>();
  else
    fail("tokenizer_config.json: '", key, "' must be a string");
  auto id = spec.token_to_id.find(content);
  return id == spec.token_to_id.end() ? -1 : id->second;
}

void apply_config(const json* config, TokenizerSpec& spec) {
  if (spec.bos_id < 0 && !spec.prefix_ids.empty()) spec.bos_id = spec.prefix_ids.front();
  if (config == nullptr) return;
  GYRE_CHECK(config->is_object(), "tokenizer_config.json: expected a JSON object");
  if (const int bos = config_token_id(*config, "bos_token", spec); bos >= 0) spec.bos_id = bos;
  if (const int eos = config_token_id(*config, "eos_token", spec); eos >= 0) spec.eos_ids = {eos};
  // transformers rebuilds the post-processor from these flags when the config sets them.
  auto add_bos = config->find("add_bos_token");
  if (add_bos != config->end() && add_bos->is_boolean()) {
    spec.prefix_ids.clear();
    if (add_bos->get<bool>() && spec.bos_id >= 0) spec.prefix_ids.push_back(spec.bos_id);
  }
  auto add_eos = config->find("add_eos_token");
  if (add_eos != config->end() && add_eos->is_boolean()) {
    spec.suffix_ids.clear();
    if (add_eos->get<bool>() && !spec.eos_ids.empty()) spec.suffix_ids.push_back(spec.eos_ids[0]);
  }
}

}  // namespace
}  // namespace tok

std::unique_ptr<Tokenizer> Tokenizer::from_hf(const std::string& tokenizer_json,
                                              const nlohmann::json* tokenizer_config) {
  using nlohmann::json;
  tok::check_depth(tokenizer_json);
  json j = json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  GYRE_CHECK(!j.is_discarded(), "tokenizer.json: not valid JSON");
  GYRE_CHECK(j.is_object(), "tokenizer.json: expected a JSON object");
  tok::TokenizerSpec spec;
  try {
    GYRE_CHECK(j.contains("model"), "tokenizer.json: no 'model'");
    tok::parse_model(j["model"], spec);
    tok::parse_added_tokens(j.value("added_tokens", json()), spec);
    tok::parse_normalizer(j.value("normalizer", json()), spec);
    tok::parse_pre_tokenizer(j.value("pre_tokenizer", json()), spec);
    tok::parse_post_processor(j.value("post_processor", json()), spec);
    tok::parse_decoder(j.value("decoder", json()), spec);
    tok::apply_config(tokenizer_config, spec);
  } catch (const json::exception& e) {
    fail("tokenizer.json: malformed (", e.what(), ")");
  }
  for (int id : spec.prefix_ids)
    GYRE_CHECK(id >= 0 && static_cast<size_t>(id) < spec.id_to_token.size(),
               "tokenizer.json: post-processor token id ", id, " is not in the vocabulary");
  for (int id : spec.suffix_ids)
    GYRE_CHECK(id >= 0 && static_cast<size_t>(id) < spec.id_to_token.size(),
               "tokenizer.json: post-processor token id ", id, " is not in the vocabulary");
  GYRE_CHECK(!spec.id_to_token.empty(), "tokenizer.json: the vocabulary is empty");
  return std::make_unique<tok::BpeTokenizer>(std::move(spec));
}

std::unique_ptr<Tokenizer> Tokenizer::from_folder(const std::string& dir) {
  namespace fs = std::filesystem;
  const auto read = [](const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    GYRE_CHECK(in, "cannot read ", path.string());
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  const fs::path json_path = fs::path(dir) / "tokenizer.json";
  GYRE_CHECK(fs::is_regular_file(json_path), "no tokenizer.json in ", dir);
  const std::string text = read(json_path);
  const fs::path config_path = fs::path(dir) / "tokenizer_config.json";
  if (!fs::is_regular_file(config_path)) return from_hf(text, nullptr);
  nlohmann::json config = nlohmann::json::parse(read(config_path), nullptr, false);
  GYRE_CHECK(!config.is_discarded() && config.is_object(), config_path.string(),
             ": not a valid JSON object");
  return from_hf(text, &config);
}

}  // namespace gyre
