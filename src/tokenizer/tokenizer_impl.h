// The one concrete tokenizer behind gyre::Tokenizer: a BPE model (merges by rank or by piece
// score) with the normalizer, pre-tokenizer, post-processor and decoder steps a tokenizer.json or
// a GGUF file describes. The loaders (hf_tokenizer.cc, gguf_tokenizer.cc) fill a TokenizerSpec.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/regex_splitter.h"
#include "tokenizer/text_util.h"
#include "tokenizer/tokenizer.h"

namespace gyre::tok {

struct AddedToken {
  std::string content;
  int id = -1;
  bool special = false;
  bool lstrip = false, rstrip = false, single_word = false;
};

enum class MergeOrder { kRank, kScore };

struct MergeRule {
  int rank;
  int result_id;
};

enum class DecodeStep { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
struct DecoderStep {
  DecodeStep kind;
  std::string from, to;    // kReplace; kMetaspace uses `from` as the replacement character
  std::string strip_char;  // kStrip: one character
  int strip_start = 0, strip_stop = 0;
  bool metaspace_strip_first = true;
};

// Where the SentencePiece "▁" goes: none, every text segment, or only the text's first segment.
enum class PrependScheme { kNever, kAlways, kFirst };

struct TokenizerSpec {
  // Vocabulary: id -> token string (added tokens included); holes are empty strings.
  std::vector<std::string> id_to_token;
  std::unordered_map<std::string, int> token_to_id;

  // Model.
  MergeOrder merge_order = MergeOrder::kRank;
  std::unordered_map<uint64_t, MergeRule> merges;  // key: (left id << 32) | right id
  std::vector<float> scores;                       // kScore: score per id
  bool byte_level = false;               // bytes pass through the GPT-2 byte map before the model
  bool byte_level_prefix_space = false;  // ByteLevel add_prefix_space: a space before each segment
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;
  int unk_id = -1;

  // Normalizer steps in order, applied per text segment between added tokens: prepend `to` to
  // the (non-empty) segment when `prepend`, else replace every `from` with `to`.
  struct NormalizerStep {
    bool prepend = false;
    std::string from, to;
  };
  std::vector<NormalizerStep> normalizer;
  // Metaspace pre-tokenizer (an alternative to Prepend + Replace).
  bool metaspace = false;
  std::string metaspace_char = "\xE2\x96\x81";
  PrependScheme metaspace_prepend = PrependScheme::kAlways;
  bool metaspace_split = false;

  // Pre-tokenizer: regexes applied one after another, each splitting every piece further.
  std::vector<std::string> split_patterns;

  std::vector<AddedToken> added;

  // Post-processor.
  std::vector<int> prefix_ids, suffix_ids;

  std::vector<DecoderStep> decoder;

  int bos_id = -1;
  std::vector<int> eos_ids;
  std::vector<bool> special;  // per id: skipped by decode(skip_special)
};

// A GGUF "gpt2" vocabulary's pre-tokenizer, by its tokenizer.ggml.pre name (llama.cpp's names for
// the HF pre-tokenizers): the split regexes, and whether whole-word vocabulary hits skip merging.
std::vector<std::string> gguf_pre_patterns(const std::string& pre);
bool gguf_pre_ignores_merges(const std::string& pre);

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(TokenizerSpec spec);

  std::vector<int> encode(std::string_view text, bool add_special) const override;
  std::string decode(const std::vector<int>& ids, bool skip_special) const override;
  int vocab_size() const override { return static_cast<int>(spec_.id_to_token.size()); }
  int bos_id() const override { return spec_.bos_id; }
  std::vector<int> eos_ids() const override { return spec_.eos_ids; }
  bool is_special(int id) const override;
  std::string id_to_token(int id) const override;
  int token_to_id(std::string_view token) const override;

 private:
  // Text between added tokens: normalize, pre-tokenize, run the model.
  void encode_segment(std::string_view segment, bool first_segment, std::vector<int>& out) const;
  void encode_word(std::string_view word, std::vector<int>& out) const;
  void merge_by_rank(std::string_view word, std::vector<int>& out) const;
  void merge_by_score(std::string_view word, std::vector<int>& out) const;
  // Unknown text: byte tokens, or unk.
  void push_fallback(std::string_view piece, std::vector<int>& out) const;
  size_t match_added(std::string_view text, size_t pos, size_t& match_len) const;

  TokenizerSpec spec_;
  ByteLevelMap byte_map_;
  std::vector<std::unique_ptr<RegexSplitter>> splitters_;
  std::vector<int> byte_token_ids_;  // 256 entries, -1 where the vocabulary lacks <0xXX>
  // Added tokens by first byte, longest first, for leftmost-longest matching.
  std::vector<std::vector<int>> added_by_first_byte_;
};

}  // namespace gyre::tok
