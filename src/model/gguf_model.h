// The pieces of a GGUF model, read from a parsed file: config, weights (canonical names), and
// tokenizer data. gguf_loader.cc puts them together; tests use them one by one.
#pragma once
#include <string>

#include "model/config.h"
#include "model/gguf.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace gyre {

// {arch}.* keys -> ModelConfig (validated). Tensor presence decides tie_embeddings and qkv_bias.
ModelConfig gguf_read_config(const GgufFile& f);

// Adds the tensors as views into the file, renamed to the canonical Hugging Face names with
// shapes in [out, in] order (the GGUF ne order reversed). Quantized data stays as it is.
// Tensors Gyre does not use are left out; a used tensor of a type Gyre cannot read throws.
// Keeps the mapped file alive through `out` when f was opened from a path.
void gguf_read_weights(const GgufFile& f, WeightSet& out);

// "blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight"; empty when not a tensor
// Gyre uses.
std::string gguf_canonical_name(const std::string& gguf_name);

GgufVocab gguf_read_vocab(const GgufFile& f);

std::string gguf_chat_template(const GgufFile& f);  // empty when absent

}  // namespace gyre
