// The quantizer's forward pass, one decoder block at a time, over the Backend interface (the CPU
// backend here; a GPU backend can run the same code). Before each group of linear layers that
// share an input ("unit": q|k|v, o, gate|up, down) a hook sees that input and may replace the
// unit's weights (GPTQ quantizes them in place), so later units see the quantized outputs of
// earlier ones, and the next block is fed this block's quantized output.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/weights.h"

namespace gyre::quant {

enum class Unit { QKV, O, GateUp, Down };
constexpr int kUnits = 4;
const char* unit_name(Unit u);
// The linear layers of a unit, by suffix after "model.layers.{i}." (without ".weight").
std::vector<std::string> unit_linears(Unit u);

// One block's weights as floats ([out, in] row-major), by suffix: "self_attn.q_proj", ...,
// "input_layernorm", "post_attention_layernorm", and the q/k/v biases ("self_attn.q_proj.bias")
// when the family has them.
struct BlockWeights {
  std::map<std::string, std::vector<float>> t;
};
BlockWeights block_weights_from(const WeightSet& w, const ModelConfig& c, int layer);

// A whole tensor as floats (any dtype the loader yields).
std::vector<float> tensor_to_f32(const TensorView& t);

// x: the unit's input [tokens, in] (host floats); may change w.
using UnitHook =
    std::function<void(Unit unit, const std::vector<float>& x, int64_t tokens, BlockWeights& w)>;

// One block's weights in the backend's layout, uploaded once and reused by many forwards (the
// sensitivity pass runs every perturbed copy of the hidden states through it). By the same
// suffixes as BlockWeights. On the CPU the F32 tensors point at the host floats they came from,
// which must outlive this.
struct DeviceBlock {
  std::map<std::string, Tensor> t;
};
// As UnitHook, for a block already on the backend: may replace the unit's tensors in w (which is
// this forward's own copy of the block).
using DeviceUnitHook =
    std::function<void(Unit unit, const std::vector<float>& x, int64_t tokens, DeviceBlock& w)>;

class BlockRunner {
 public:
  BlockRunner(Backend& backend, const ModelConfig& c, int rows, int length);
  // hidden [rows * length, dim] in place: through one decoder block.
  void run(std::vector<float>& hidden, BlockWeights& w, const UnitHook& hook);
  // The same forward on hidden states and weights already on the backend.
  void run(Tensor& hidden, DeviceBlock w, const DeviceUnitHook& hook);
  DeviceBlock upload(const BlockWeights& w);
  // A weight tensor `name` (a BlockWeights suffix) of this config's shape from host floats.
  Tensor upload_tensor(const std::string& name, const std::vector<float>& host);
  // Host floats [rows * length, dim] to a backend activation and back.
  Tensor to_device(const std::vector<float>& host);
  std::vector<float> to_host(const Tensor& t);
  // The logits [rows * length, vocab] of hidden through the final norm and head [vocab, dim]
  // (both uploaded with upload_weight_floats), left on the backend.
  Tensor logits(const Tensor& hidden, const Tensor& norm, const Tensor& head);
  Tensor upload_weight_floats(const std::vector<float>& w, int64_t rows, int64_t cols) {
    return weight(w, rows, cols);
  }
  Backend& backend() { return be_; }

  // The final norm of hidden (the LM head's input).
  std::vector<float> final_norm(const std::vector<float>& hidden, const std::vector<float>& norm);
  // The logits [rows * length, vocab] of final_norm's output through head [vocab, dim].
  std::vector<float> logits(const std::vector<float>& normed, const std::vector<float>& head,
                            int64_t vocab);

 private:
  Tensor to_device(const std::vector<float>& host, int64_t rows, int64_t cols);
  Tensor weight(const std::vector<float>& w, int64_t rows, int64_t cols);
  std::pair<int64_t, int64_t> shape_of(const std::string& name) const;
  // The block's ops on x in place: get(name) gives a weight (data null when absent, e.g. a
  // bias), at_unit(unit, input) runs before the unit's weights are fetched.
  void forward(Tensor& x, const std::function<Tensor(const std::string&)>& get,
               const std::function<void(Unit, const Tensor&)>& at_unit);

  Backend& be_;
  ModelConfig c_;
  int rows_, length_;
  RopeTable rope_;
  std::unique_ptr<KvCache> cache_;
  std::vector<int32_t> positions_;
};

}  // namespace gyre::quant
