// Tokenizer: text <-> token ids, built from a Hugging Face tokenizer.json (+ tokenizer_config.json)
// or from a GGUF file's tokenizer.ggml.* metadata. Two model kinds:
//   - byte-level BPE (Llama 3, GPT-2/SmolLM2, Qwen2): regex pre-tokenizer, bytes mapped to
//     printable unicode, merges by rank;
//   - SentencePiece-style BPE with byte fallback (Llama 2, Mistral): "▁" for spaces, merges
//     by rank (tokenizer.json) or by piece score (GGUF), <0xXX> tokens for unknown bytes.
// Added/special tokens are matched in the text before the model runs.
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace gyre {

// Tokenizer data as a GGUF file carries it (tokenizer.ggml.*).
struct GgufVocab {
  std::string model;  // "llama" (SentencePiece) or "gpt2" (byte-level BPE)
  std::string pre;    // pre-tokenizer name for gpt2 models: "llama-bpe", "smollm", "qwen2", ...
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t>
      token_types;  // 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte
  std::vector<std::string> merges;  // "a b"
  int bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;
  bool add_bos = true, add_eos = false, add_space_prefix = true;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // tokenizer_json: the file's text. tokenizer_config may be null. Throws gyre::Error.
  static std::unique_ptr<Tokenizer> from_hf(const std::string& tokenizer_json,
                                            const nlohmann::json* tokenizer_config);
  static std::unique_ptr<Tokenizer> from_gguf(const GgufVocab& vocab);
  // A folder holding tokenizer.json (and optionally tokenizer_config.json).
  static std::unique_ptr<Tokenizer> from_folder(const std::string& dir);

  // add_special: add BOS/EOS as the tokenizer's post-processor / add_bos flags say.
  // Special-token strings inside the text are always matched as special tokens.
  virtual std::vector<int> encode(std::string_view text, bool add_special) const = 0;
  // skip_special: leave out control tokens (BOS, EOS, ...).
  virtual std::string decode(const std::vector<int>& ids, bool skip_special) const = 0;

  virtual int vocab_size() const = 0;
  virtual int bos_id() const = 0;                // -1 when none
  virtual std::vector<int> eos_ids() const = 0;  // may be empty
  virtual bool is_special(int id) const = 0;
  virtual std::string id_to_token(int id) const = 0;          // the raw vocabulary string
  virtual int token_to_id(std::string_view token) const = 0;  // -1 when absent
};

// Tokens that close an assistant turn in common chat templates (<|eot_id|>, <|im_end|>, ...)
// that this vocabulary has as special tokens: a chat reply ends there even when the config's EOS
// list leaves them out.
std::vector<int> end_of_turn_ids(const Tokenizer& tok);

// Streams text as ids arrive and never emits half a UTF-8 character: bytes of an incomplete
// sequence are held until it completes (or flush() is called). Handles decoders that strip the
// leading space of the first token.
class StreamDecoder {
 public:
  StreamDecoder(const Tokenizer& tok, bool skip_special);
  std::string push(int id);  // the new complete text, possibly empty
  std::string flush();       // whatever is left, invalid bytes replaced by U+FFFD

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  // Once everything decoded so far is out, forgets all but the last few ids (cutting before a
  // token that is whole characters on its own), so each push costs O(1) tokens, not O(length).
  void trim();

  std::vector<int> ids_;
  size_t emitted_ = 0;  // bytes of decode(ids_) already returned
};

}  // namespace gyre
