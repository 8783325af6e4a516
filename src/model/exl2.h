// ExLlamaV2 (EXL2) checkpoints: a Hugging Face folder whose config.json has quantization_config
// {quant_method "exl2", bits, head_bits, ...} and, per linear layer P with K inputs and N outputs,
//   P.q_invperm   I32/I16 [K]     act-order: input i is quantized row q_invperm[i]
//   P.q_perm      (optional)      its inverse; ExLlamaV2 recomputes it, Gyre checks it
//   P.q_groups    I16 [2 G]       per group: (bits, first packed row in q_weight), bits in
//                                 {8, 6, 5, 4, 3, 2} and non-increasing (ExLlamaV2's kernels
//                                 walk the rows by bit width in that order)
//   P.q_weight    I32 [R, Np]     Np = N rounded up to 32; a group's rows are, per column, one
//                                 little-endian stream of bits-wide codes from bit 0 of its
//                                 first packed row (codes may straddle two words)
//   P.q_scale     I32 [G, Np / 8] 4-bit scale codes, column n at bits 4 (n % 8) of word n / 8
//   P.q_scale_max F16 [G]
//   P.bias        (optional, passed through)
// A group has (next first - first) * 32 / bits rows; the last one has the rest of K.
// ExLlamaV2's value, every step rounded to fp16 (nearest even), as its loader and kernels do:
//   m = fp16(q_scale_max / 256), s = fp16((code + 1)^2 * m), W[n, i] = fp16((q - 2^(bits-1)) * s)
// with q the code of quantized row q_invperm[i] in column n (each product is exact in f32, so
// one rounding to fp16 gives the same bits as the GPU's half arithmetic).
//
// The loader keeps a layer quantized in Gyre's layouts, which hold its codes and scales as they
// are (exl2_quantize_layer): each width's groups, of one supported group size (32, 64, 128, 256
// rows; also 16 at 8 bits; a width of one group takes the smallest that holds it), become one
// packed weight over that width's input rows, the last group padded with zero-valued columns
// when it is short (ExLlamaV2 sizes each width's groups by ceil, so the layer's last group
// often is). One width without padding is a QWeightHost whose perm is the act-order; anything
// else a QMixedHost with one part per width. Gyre's value is the exact product
// (q - 2^(bits-1)) * s, of which EXL2's is the fp16 rounding (the CUDA kernels' half arithmetic
// rounds the same way; the CPU keeps f32). A layer whose groups of one width differ otherwise
// in size is dequantized to an F16 weight (exact: every value is an fp16 number) by
// exl2_dequantize.
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "backend/cpu/qlinear_ref.h"
#include "backend/cpu/qmixed.h"
#include "model/config.h"
#include "model/weights.h"

namespace gyre {

struct Exl2Config {
  double bits = 0;       // informational: average bits per weight of the decoder layers
  double head_bits = 0;  // informational: the head's bits (16: not quantized)
};

// Reads config.json's quantization_config: true when it is EXL2 (quant_method "exl2"), false
// for no or another quantization_config; throws on a malformed EXL2 configuration.
bool exl2_config_from_hf(const nlohmann::json& config, Exl2Config& out);

// One layer's tensors (q_perm may be null).
struct Exl2Tensors {
  const TensorView* q_weight = nullptr;
  const TensorView* q_scale = nullptr;
  const TensorView* q_scale_max = nullptr;
  const TensorView* q_groups = nullptr;
  const TensorView* q_invperm = nullptr;
  const TensorView* q_perm = nullptr;
};

// The layer's weight as out_features rows of K floats, row-major [N, K] (W[n, i] at n * K + i);
// out_features < 0 takes q_weight's (padded) width, otherwise it must round up to that width.
// Throws a one-line gyre::Error naming `name` on any inconsistency of dtypes, shapes, sizes, the
// group table or the permutation.
std::vector<float> exl2_dequantize(const std::string& name, const Exl2Tensors& t,
                                   int64_t out_features);

// The layer in Gyre's quantized layouts: `single` for one width without padding, `mixed` (a part
// per width) otherwise, or neither with `reason` saying why (the layer is then dequantized).
// Throws as exl2_dequantize does.
struct Exl2Quantized {
  std::shared_ptr<QWeightHost> single;
  std::shared_ptr<QMixedHost> mixed;
  std::string reason;
};
Exl2Quantized exl2_quantize_layer(const std::string& name, const Exl2Tensors& t,
                                  int64_t out_features);

// What exl2_load_weights did, logged once per model as "EXL2: N of M layers kept quantized, K
// dequantized to F16 (reasons)".
struct Exl2LoadReport {
  int quantized = 0, dequantized = 0;
  std::vector<std::pair<std::string, int>> reasons;  // each reason and its layer count
  std::string summary() const;
};

// The output features ExLlamaV2 padded away for layer P of a Llama-family model (the
// projections and lm_head), or -1 for a name it does not know.
int64_t exl2_out_features(const ModelConfig& c, const std::string& layer);

// The canonical weights of an EXL2 checkpoint whose safetensors tensors are in `raw`: each layer
// P (found by its P.q_weight) becomes "P.weight" [N, K], QPACKED (a QWeightHost or QMixedHost
// view) where exl2_quantize_layer can, F16 otherwise; its EXL2 tensors are dropped and every
// other tensor is passed through. `out` keeps `raw` alive. Logs the report's summary to stderr.
Exl2LoadReport exl2_load_weights(const ModelConfig& c, std::shared_ptr<const WeightSet> raw,
                                 WeightSet& out);

}  // namespace gyre
