// `gyre convert -m MODEL.gguf`: the GGUF model dequantized into a Hugging Face folder that the
// conversion then reads like any other (config.json derived from the loaded ModelConfig,
// model.safetensors, and tokenizer.json + tokenizer_config.json generated from the GGUF
// tokenizer metadata, tokenizer/hf_export.h). GGUF llama/mistral files store q/k rows permuted
// for pairwise RoPE; the folder holds them in the Hugging Face (rotate-half) order.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "model/config.h"

namespace gyre::quant {

bool is_gguf_file(const std::string& path);

// config.json keys that config_from_hf_json reads back into `c` (tensor dtype aside). Throws a
// one-line gyre::Error for what config.json cannot express (partial RoPE, per-pair rope_freqs).
nlohmann::json hf_config_from(const ModelConfig& c);

// Writes the dequantized model into out_dir (created; files replaced), one tensor at a time, in
// shards of at most shard_bytes (st_writer.h): quantized GGUF tensors become F16, F32/F16/BF16
// ones keep their precision (BF16 as F32). Checks that the folder loads. Throws gyre::Error
// with one line for a GGUF Gyre cannot convert.
void export_gguf_as_hf(const std::string& gguf_path, const std::string& out_dir,
                       uint64_t shard_bytes = uint64_t{4096} << 20);

}  // namespace gyre::quant
