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

class BlockRunner {
 public:
  BlockRunner(Backend& backend, const ModelConfig& c, int rows, int length);
  // hidden [rows * length, dim] in place: through one decoder block.
  void run(std::vector<float>& hidden, BlockWeights& w, const UnitHook& hook);
  // The final norm of hidden (the LM head's input).
  std::vector<float> final_norm(const std::vector<float>& hidden, const std::vector<float>& norm);
  // The logits [rows * length, vocab] of final_norm's output through head [vocab, dim].
  std::vector<float> logits(const std::vector<float>& normed, const std::vector<float>& head,
                            int64_t vocab);

 private:
  Tensor to_device(const std::vector<float>& host, int64_t rows, int64_t cols);
  std::vector<float> to_host(const Tensor& t);
  Tensor weight(const std::vector<float>& w, int64_t rows, int64_t cols);

  Backend& be_;
  ModelConfig c_;
  int rows_, length_;
  RopeTable rope_;
  std::unique_ptr<KvCache> cache_;
  std::vector<int32_t> positions_;
};

}  // namespace gyre::quant
