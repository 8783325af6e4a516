// GgufVocab -> tokenizer.json / tokenizer_config.json. Each field written here is one that
// hf_tokenizer.cc reads back into the same TokenizerSpec that gguf_tokenizer.cc builds from the
// GGUF metadata; the files are also ordinary Hugging Face tokenizer files.
#include "tokenizer/hf_export.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/text_util.h"
#include "tokenizer/tokenizer_impl.h"

namespace gyre {

namespace {

using nlohmann::json;

constexpr int32_t kTypeUnknown = 2, kTypeControl = 3, kTypeUserDefined = 4;
constexpr const char* kSpace = "\xE2\x96\x81";  // "▁"

int32_t type_of(const GgufVocab& v, size_t id) {
  return v.token_types.empty() ? 1 : v.token_types[id];
}

// Control and unknown tokens are never merge results or parts (gguf_tokenizer.cc's score merge
// skips them); they and user-defined tokens are matched whole in the text, as added tokens.
bool is_special_type(int32_t t) {
  return t == kTypeControl || t == kTypeUnknown;
}

json added_tokens(const GgufVocab& v) {
  json out = json::array();
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    const int32_t t = type_of(v, id);
    if (v.tokens[id].empty() || !(is_special_type(t) || t == kTypeUserDefined)) continue;
    out.push_back({{"id", id},
                   {"content", v.tokens[id]},
                   {"single_word", false},
                   {"lstrip", false},
                   {"rstrip", false},
                   {"normalized", false},
                   {"special", t != kTypeUserDefined}});
  }
  return out;
}

// SentencePiece merges by score: at each step the adjacent pair whose concatenation is the
// best-scoring piece merges. As ranks: every split of every piece into two pieces, ordered by
// the whole piece's score (best first), then by id and split point so the order is fixed.
json merges_by_score(const GgufVocab& v, const std::unordered_map<std::string, int>& id_of) {
  struct Merge {
    float score;
    int id;
    size_t split;
  };
  std::vector<Merge> merges;
  const auto usable = [&](const std::string& s) {
    const auto it = id_of.find(s);
    return it != id_of.end() && !is_special_type(type_of(v, static_cast<size_t>(it->second)));
  };
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    const std::string& t = v.tokens[id];
    if (t.empty() || is_special_type(type_of(v, id))) continue;
    size_t split = 0;
    for (const std::string_view ch : tok::utf8_chars(t)) {
      if (split > 0 && usable(t.substr(0, split)) && usable(t.substr(split)))
        merges.push_back(
            {std::isnan(v.scores[id]) ? -INFINITY : v.scores[id], static_cast<int>(id), split});
      split += ch.size();
    }
  }
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    return std::tie(b.score, a.id, a.split) < std::tie(a.score, b.id, b.split);
  });
  json out = json::array();
  for (const Merge& m : merges) {
    const std::string& t = v.tokens[static_cast<size_t>(m.id)];
    out.push_back(json::array({t.substr(0, m.split), t.substr(m.split)}));
  }
  return out;
}

json gguf_merges(const std::vector<std::string>& merges) {
  json out = json::array();
  for (const std::string& m : merges) {
    const size_t space = m.find(' ', 1);
    GYRE_CHECK(space != std::string::npos && space + 1 < m.size(), "GGUF tokenizer: merge '", m,
               "' is not two tokens separated by a space");
    out.push_back(json::array({m.substr(0, space), m.substr(space + 1)}));
  }
  return out;
}

json template_processing(const GgufVocab& v) {
  json single = json::array(), specials = json::object();
  const auto special = [&](int id) {
    const std::string& t = v.tokens[static_cast<size_t>(id)];
    specials[t] = {{"id", t}, {"ids", {id}}, {"tokens", {t}}};
    return json{{"SpecialToken", {{"id", t}, {"type_id", 0}}}};
  };
  if (v.add_bos && v.bos_id >= 0) single.push_back(special(v.bos_id));
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  if (v.add_eos && v.eos_id >= 0) single.push_back(special(v.eos_id));
  return {{"type", "TemplateProcessing"}, {"single", single}, {"special_tokens", specials}};
}

json split(const std::string& regex) {
  return {{"type", "Split"},
          {"pattern", {{"Regex", regex}}},
          {"behavior", "Isolated"},
          {"invert", false}};
}

json token_or_null(const GgufVocab& v, int id) {
  return id >= 0 && static_cast<size_t>(id) < v.tokens.size() ? json(v.tokens[id]) : json();
}

}  // namespace

json gguf_vocab_to_tokenizer_json(const GgufVocab& v) {
  GYRE_CHECK(v.model == "gpt2" || v.model == "llama", "GGUF tokenizer model '", v.model,
             "' cannot be written as tokenizer.json (Gyre converts gpt2 and llama tokenizers)");
  GYRE_CHECK(!v.tokens.empty(), "GGUF tokenizer: no tokens");
  GYRE_CHECK(v.token_types.empty() || v.token_types.size() == v.tokens.size(),
             "GGUF tokenizer: ", v.token_types.size(), " token types for ", v.tokens.size(),
             " tokens");
  std::unordered_map<std::string, int> id_of;
  json vocab = json::object();
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    const std::string& t = v.tokens[id];
    if (t.empty()) continue;  // a hole: no text encodes to it
    GYRE_CHECK(id_of.emplace(t, static_cast<int>(id)).second, "GGUF tokenizer: token '", t,
               "' appears twice (ids ", id_of[t], " and ", id,
               "); tokenizer.json cannot hold that vocabulary");
    vocab[t] = id;
  }
  json model = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", token_or_null(v, v.unk_id)},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"vocab", vocab}};
  json j = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}};
  j["added_tokens"] = added_tokens(v);
  if (v.model == "gpt2") {
    model["byte_fallback"] = false;
    model["ignore_merges"] = tok::gguf_pre_ignores_merges(v.pre);
    model["merges"] = gguf_merges(v.merges);
    json pre = json::array();
    for (const std::string& p : tok::gguf_pre_patterns(v.pre)) pre.push_back(split(p));
    // The GPT-2 regex is among the splits above, so ByteLevel only maps the bytes.
    pre.push_back({{"type", "ByteLevel"},
                   {"add_prefix_space", false},
                   {"trim_offsets", true},
                   {"use_regex", false}});
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", pre}};
    j["decoder"] = {{"type", "ByteLevel"},
                    {"add_prefix_space", false},
                    {"trim_offsets", true},
                    {"use_regex", false}};
  } else {
    GYRE_CHECK(v.scores.size() == v.tokens.size(), "GGUF tokenizer: ", v.scores.size(),
               " scores for ", v.tokens.size(), " tokens");
    model["byte_fallback"] = true;
    model["ignore_merges"] = false;
    model["merges"] = merges_by_score(v, id_of);
    json norm = json::array();
    if (v.add_space_prefix) norm.push_back({{"type", "Prepend"}, {"prepend", kSpace}});
    norm.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}});
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", norm}};
    j["pre_tokenizer"] = nullptr;
    json dec =
        json::array({{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                     {{"type", "ByteFallback"}},
                     {{"type", "Fuse"}}});
    if (v.add_space_prefix)
      dec.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    j["decoder"] = {{"type", "Sequence"}, {"decoders", dec}};
  }
  j["post_processor"] = template_processing(v);
  j["model"] = model;
  return j;
}

json gguf_vocab_to_tokenizer_config(const GgufVocab& v, const std::string& chat_template) {
  json c = {{"add_bos_token", v.add_bos},
            {"add_eos_token", v.add_eos},
            {"bos_token", token_or_null(v, v.bos_id)},
            {"eos_token", token_or_null(v, v.eos_id)},
            {"unk_token", token_or_null(v, v.unk_id)},
            {"pad_token", token_or_null(v, v.pad_id)},
            {"clean_up_tokenization_spaces", false},
            {"tokenizer_class", "PreTrainedTokenizerFast"}};
  if (!chat_template.empty()) c["chat_template"] = chat_template;
  return c;
}

}  // namespace gyre
