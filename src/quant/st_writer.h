// A minimal safetensors writer (the reader is model/safetensors.h), writing to NAME.tmp and
// renaming, so an interrupted write never leaves a truncated file under the final name. Tensors
// are written from views (StSource: bytes someone else owns, e.g. a mapped job file), so a model
// is streamed to disk, never assembled in memory, and split into shards the way Hugging Face
// folders are (model-0000i-of-0000n.safetensors + model.safetensors.index.json).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace gyre::quant {

struct StTensor {
  std::string name;
  std::string dtype;  // "F32", "F16", "BF16", "I32"
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// A tensor whose bytes live elsewhere and outlive the write, or, where data is null, are made by
// `make` when the writer reaches it (nbytes of them), so that only one such tensor is in memory.
struct StSource {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  std::function<std::vector<uint8_t>()> make = {};
};

void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors);
void write_safetensors(const std::string& path, const std::vector<StSource>& tensors);

// Writes the tensors into dir, in order, as shards of at most max_shard_bytes of tensor data each
// (a tensor larger than that gets a shard of its own): model.safetensors when one shard holds
// them all, else model-00001-of-0000N.safetensors ... and model.safetensors.index.json (its
// weight_map and metadata.total_size, as transformers writes it). Removes any model*.safetensors
// and index left in dir by an earlier conversion first. Returns the files' names.
std::vector<std::string> write_safetensors_shards(const std::string& dir,
                                                  const std::vector<StSource>& tensors,
                                                  uint64_t max_shard_bytes);

// Writes text to path via path.tmp and a rename.
void write_file_atomic(const std::string& path, const std::string& text);

}  // namespace gyre::quant
