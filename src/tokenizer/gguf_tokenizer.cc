// Tokenizer::from_gguf: tokenizer.ggml.* metadata -> TokenizerSpec. Two models:
//   "gpt2":  byte-level BPE with the given merges and a split regex chosen by the `pre` name;
//   "llama": SentencePiece, merging by piece score, with byte fallback and a "▁" space prefix.
#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace gyre {
namespace tok {

std::vector<std::string> gguf_pre_patterns(const std::string& pre) {
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") return {kLlama3Pattern};
  if (pre == "qwen2") return {kQwen2Pattern};
  // SmolLM's HF pre-tokenizer isolates each digit before the GPT-2 split.
  if (pre == "smollm") return {R"(\p{N})", kGpt2Pattern};
  return {kGpt2Pattern};
}

bool gguf_pre_ignores_merges(const std::string& pre) {
  return pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3";
}

namespace {

constexpr int32_t kTypeUnknown = 2, kTypeControl = 3, kTypeUserDefined = 4;
constexpr const char* kSpace = "\xE2\x96\x81";  // "▁"

void fill_vocab(const GgufVocab& v, TokenizerSpec& spec) {
  GYRE_CHECK(!v.tokens.empty(), "GGUF tokenizer: no tokens");
  GYRE_CHECK(v.token_types.empty() || v.token_types.size() == v.tokens.size(),
             "GGUF tokenizer: ", v.token_types.size(), " token types for ", v.tokens.size(),
             " tokens");
  spec.id_to_token = v.tokens;
  spec.special.assign(v.tokens.size(), false);
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    spec.token_to_id.emplace(v.tokens[id], static_cast<int>(id));
    const int32_t type = v.token_types.empty() ? 1 : v.token_types[id];
    // Control, unknown and user-defined tokens are matched as whole strings in the text.
    if ((type == kTypeControl || type == kTypeUnknown || type == kTypeUserDefined) &&
        !v.tokens[id].empty()) {
      AddedToken a;
      a.content = v.tokens[id];
      a.id = static_cast<int>(id);
      a.special = type != kTypeUserDefined;
      spec.added.push_back(a);
    }
    spec.special[id] = type == kTypeControl || type == kTypeUnknown;
  }
  const auto check_id = [&](int id, const char* what) {
    GYRE_CHECK(id >= -1 && id < static_cast<int>(v.tokens.size()), "GGUF tokenizer: ", what, " id ",
               id, " out of range");
    return id;
  };
  spec.bos_id = check_id(v.bos_id, "BOS");
  if (check_id(v.eos_id, "EOS") >= 0) spec.eos_ids = {v.eos_id};
  spec.unk_id = check_id(v.unk_id, "UNK");
  check_id(v.pad_id, "PAD");
  if (v.add_bos && spec.bos_id >= 0) spec.prefix_ids = {spec.bos_id};
  if (v.add_eos && v.eos_id >= 0) spec.suffix_ids = {v.eos_id};
}

void build_gpt2(const GgufVocab& v, TokenizerSpec& spec) {
  spec.byte_level = true;
  spec.split_patterns = gguf_pre_patterns(v.pre);
  spec.ignore_merges = gguf_pre_ignores_merges(v.pre);
  int rank = 0;
  for (const std::string& m : v.merges) {
    const size_t space = m.find(' ', 1);
    GYRE_CHECK(space != std::string::npos && space + 1 < m.size(), "GGUF tokenizer: merge '", m,
               "' is not two tokens separated by a space");
    const auto id = [&](const std::string& s) {
      auto it = spec.token_to_id.find(s);
      GYRE_CHECK(it != spec.token_to_id.end(), "GGUF tokenizer: merge token '", s,
                 "' is not in the vocabulary");
      return it->second;
    };
    const std::string left = m.substr(0, space), right = m.substr(space + 1);
    const int a = id(left), b = id(right), merged = id(left + right);
    spec.merges.emplace((static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b),
                        MergeRule{rank++, merged});
  }
  spec.decoder.push_back({DecodeStep::kByteLevel, "", "", "", 0, 0, true});
}

void build_llama(const GgufVocab& v, TokenizerSpec& spec) {
  GYRE_CHECK(v.scores.size() == v.tokens.size(), "GGUF tokenizer: ", v.scores.size(),
             " scores for ", v.tokens.size(), " tokens");
  spec.merge_order = MergeOrder::kScore;
  spec.scores = v.scores;
  spec.byte_fallback = true;
  if (v.add_space_prefix) spec.normalizer.push_back({true, "", kSpace});
  spec.normalizer.push_back({false, " ", kSpace});
  spec.decoder.push_back({DecodeStep::kReplace, kSpace, " ", "", 0, 0, true});
  spec.decoder.push_back({DecodeStep::kByteFallback, "", "", "", 0, 0, true});
  spec.decoder.push_back({DecodeStep::kFuse, "", "", "", 0, 0, true});
  if (v.add_space_prefix) spec.decoder.push_back({DecodeStep::kStrip, "", "", " ", 1, 0, true});
}

}  // namespace
}  // namespace tok

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufVocab& vocab) {
  tok::TokenizerSpec spec;
  tok::fill_vocab(vocab, spec);
  if (vocab.model == "gpt2")
    tok::build_gpt2(vocab, spec);
  else if (vocab.model == "llama")
    tok::build_llama(vocab, spec);
  else
    fail("GGUF tokenizer: unsupported tokenizer model '", vocab.model, "' (want llama or gpt2)");
  return std::make_unique<tok::BpeTokenizer>(std::move(spec));
}

}  // namespace gyre
