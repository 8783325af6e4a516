// GGUF model files: metadata -> ModelConfig, tensors -> WeightSet (canonical names and PyTorch
// shape order), tokenizer.ggml.* -> GgufVocab, tokenizer.chat_template.
#pragma once
#include <string>

#include "model/loader.h"

namespace gyre {

void gguf_load_model(const std::string& path, LoadedModel& out);
std::unique_ptr<Tokenizer> gguf_load_tokenizer(const std::string& path);

}  // namespace gyre
