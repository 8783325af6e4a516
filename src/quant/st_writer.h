// A minimal safetensors writer (the reader is model/safetensors.h), writing to NAME.tmp and
// renaming, so an interrupted write never leaves a truncated file under the final name.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace gyre::quant {

struct StTensor {
  std::string name;
  std::string dtype;  // "F32", "F16", "BF16", "I32"
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors);

// Writes text to path via path.tmp and a rename.
void write_file_atomic(const std::string& path, const std::string& text);

}  // namespace gyre::quant
