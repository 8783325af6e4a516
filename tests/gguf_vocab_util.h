// GGUF vocabularies built from the fixture tokenizer.json files the way a GGUF converter would
// write them (for the tests of Tokenizer::from_gguf and of its export as tokenizer.json).
#pragma once
#include <algorithm>
#include <string>
#include <unordered_map>

#include "test_tokenizer_util.h"
#include "tokenizer/tokenizer.h"

namespace gyre::test {

// Token types as GGUF numbers them.
inline constexpr int32_t kNormal = 1, kUnknown = 2, kControl = 3, kByte = 6;

inline bool is_byte_token(const std::string& t) {
  return t.size() == 6 && t.rfind("<0x", 0) == 0 && t.back() == '>';
}

// Vocabulary, token types and merges of a tokenizer.json, as a GGUF file would carry them.
inline GgufVocab vocab_from_json(const std::string& name) {
  const auto j = load_json(tokenizer_dir(name) + "/tokenizer.json");
  GgufVocab v;
  const auto& vocab = j.at("model").at("vocab");
  size_t size = 0;
  for (auto it = vocab.begin(); it != vocab.end(); ++it)
    size = std::max<size_t>(size, it.value().get<int>() + 1);
  for (const auto& a : j.at("added_tokens"))
    size = std::max<size_t>(size, a.at("id").get<int>() + 1);
  v.tokens.resize(size);
  v.token_types.assign(size, kNormal);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    v.tokens[it.value().get<int>()] = it.key();
    if (is_byte_token(it.key())) v.token_types[it.value().get<int>()] = kByte;
  }
  for (const auto& a : j.at("added_tokens")) {
    const int id = a.at("id");
    v.tokens[id] = a.at("content");
    if (a.at("special").get<bool>())
      v.token_types[id] = v.tokens[id] == "<unk>" ? kUnknown : kControl;
  }
  for (const auto& m : j.at("model").at("merges")) v.merges.push_back(m.get<std::string>());
  return v;
}

// SentencePiece kind: a piece's score is minus the rank of the first merge that creates it, so
// that "highest score first" replays the merge order of tokenizer.json.
inline GgufVocab llama_vocab(const std::string& name) {
  GgufVocab v = vocab_from_json(name);
  v.model = "llama";
  v.scores.assign(v.tokens.size(), -1e30f);
  std::unordered_map<std::string, int> id_of;
  for (size_t i = 0; i < v.tokens.size(); ++i) id_of.emplace(v.tokens[i], static_cast<int>(i));
  for (size_t rank = 0; rank < v.merges.size(); ++rank) {
    const std::string& m = v.merges[rank];
    const size_t space = m.find(' ');
    const int id = id_of.at(m.substr(0, space) + m.substr(space + 1));
    v.scores[id] = std::max(v.scores[id], -static_cast<float>(rank));
  }
  v.merges.clear();
  v.bos_id = 1;
  v.eos_id = 2;
  v.unk_id = 0;
  v.add_bos = false;
  return v;
}

inline GgufVocab llama3_vocab() {
  GgufVocab v = vocab_from_json("llama3");
  v.model = "gpt2";
  v.pre = "llama-bpe";
  v.bos_id = 128000;
  v.eos_id = 128001;
  v.add_bos = false;
  return v;
}

}  // namespace gyre::test
