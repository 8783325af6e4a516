// A GGUF file's tokenizer (tokenizer.ggml.*) written out as Hugging Face files, so that a model
// converted from GGUF (quant/gguf_source.h) is a self-contained folder: tokenizer.json encodes
// exactly as Tokenizer::from_gguf does, and tokenizer_config.json carries BOS/EOS, the add-BOS/EOS
// flags and the chat template.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "tokenizer/tokenizer.h"

namespace gyre {

// tokenizer.json for a "gpt2" (byte-level BPE, merges by rank) or "llama" (SentencePiece: merges
// by piece score, replayed as ranks ordered by the merged piece's score) vocabulary. Throws
// gyre::Error for another tokenizer model or a vocabulary tokenizer.json cannot express.
nlohmann::json gguf_vocab_to_tokenizer_json(const GgufVocab& v);

// tokenizer_config.json: bos_token, eos_token, unk_token, pad_token (when set), add_bos_token,
// add_eos_token, and chat_template (when not empty).
nlohmann::json gguf_vocab_to_tokenizer_config(const GgufVocab& v, const std::string& chat_template);

}  // namespace gyre
