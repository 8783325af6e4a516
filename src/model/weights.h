// The model's tensors by canonical (Hugging Face Llama) name, whatever the file format:
//   model.embed_tokens.weight [vocab, dim], lm_head.weight [vocab, dim] (absent when tied),
//   model.norm.weight [dim], and per layer i, model.layers.{i}.:
//     input_layernorm.weight, post_attention_layernorm.weight [dim]
//     self_attn.{q,k,v,o}_proj.weight [out, in], self_attn.{q,k,v}_proj.bias (Qwen2)
//     mlp.{gate,up,down}_proj.weight
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "core/tensor.h"

namespace gyre {

class WeightSet {
 public:
  void add(TensorView t);  // throws on a duplicate name
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws "missing tensor NAME" when absent.
  const TensorView& get(const std::string& name) const;
  // As get(), and checks the shape: "tensor NAME has shape [..], expected [..]".
  const TensorView& get(const std::string& name, const std::vector<int64_t>& shape) const;
  const std::map<std::string, TensorView>& all() const { return tensors_; }

  // Keeps the files (and any buffers) that the views point into alive.
  void keep(std::shared_ptr<MappedFile> f) { files_.push_back(std::move(f)); }
  void keep(std::shared_ptr<std::vector<uint8_t>> b) { buffers_.push_back(std::move(b)); }
  // Any other owner (e.g. the QWeightHost behind a QPACKED view, or another WeightSet).
  void keep_owner(std::shared_ptr<const void> o) { owners_.push_back(std::move(o)); }

 private:
  std::map<std::string, TensorView> tensors_;
  std::vector<std::shared_ptr<MappedFile>> files_;
  std::vector<std::shared_ptr<std::vector<uint8_t>>> buffers_;
  std::vector<std::shared_ptr<const void>> owners_;
};

std::string layer_tensor(int layer, const char* suffix);  // "model.layers.{layer}.{suffix}"

// Checks every tensor the config needs is present with the right shape (any dtype).
void weights_validate(const WeightSet& w, const struct ModelConfig& c);

}  // namespace gyre
