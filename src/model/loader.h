// Opens a model from a Hugging Face folder or a GGUF file: config, weights and tokenizer.
#pragma once
#include <memory>
#include <string>

#include "model/config.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace gyre {

struct LoadedModel {
  std::string path;
  std::string format;  // "hf", "gptq"/"exl2" (an HF folder of GPTQ/EXL2 weights) or "gguf"
  ModelConfig config;
  WeightSet weights;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string chat_template;  // empty when the model has none
};

// path: a folder (config.json + safetensors) or a .gguf file. Throws gyre::Error.
std::unique_ptr<LoadedModel> load_model(const std::string& path);

// Only the tokenizer: a model folder, a folder of tokenizer files, or a .gguf file.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

}  // namespace gyre
