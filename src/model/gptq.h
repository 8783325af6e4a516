// GPTQ checkpoints (AutoGPTQ / GPTQModel layout in a Hugging Face folder): config.json's
// quantization_config {quant_method "gptq", bits, group_size, desc_act, sym, checkpoint_format}
// and, per linear layer P, the tensors
//   P.qweight  I32 [in * bits / 32, out]  packed along the input dimension: the words [*, o] of
//                                         output column o are a little-endian bit stream, input
//                                         i at bits [i * bits, (i + 1) * bits) (2/4/8 bits: bits
//                                         (i % k) * bits of word i / k, k = 32 / bits; 3 bits: 32
//                                         inputs per 3 words, inputs 10 and 21 of each 32
//                                         straddling two words)
//   P.qzeros   I32 [groups, out * bits / 32]  zero points packed the same way along outputs
//   P.scales   F16 [groups, out]
//   P.g_idx    I32 [in] (optional)        group of each input column (act-order shuffles them)
//   P.bias     (optional, passed through)
// Spec value: W[o, i] = scales[g, o] * (q[i, o] - z[g, o]) with g = g_idx[i] (or i / group_size),
// where z is the stored zero + 1 for checkpoint_format "gptq" (v1) and the stored zero itself
// for "gptq_v2".
//
// Mapping to Gyre's layout (backend/cpu/qlinear_ref.h), exact in every case:
//   * columns are sorted by group (stable), giving the act-order permutation (none when g_idx is
//     absent or already sorted);
//   * group sizes Gyre has no kernel for (-1 = whole row, or e.g. 512) repeat the group's scale
//     over the largest supported size that divides it;
//   * when every zero is 2^(bits-1) and scales are F16, the symmetric layout with the same f16
//     scales: s * (q - 2^(bits-1)) is the spec formula itself;
//   * otherwise the asymmetric layout with f32 scale s and f32 min m = -(s * z): s*z and s*q are
//     exact in f32 (at most 11 + 9 significant bits) and so is their difference s*(q - z), so
//     s*q + m equals the spec value bit for bit (an f16 min, as Q4_1 has, would round s*z).
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "backend/cpu/qlinear_ref.h"
#include "model/weights.h"

namespace gyre {

struct GptqConfig {
  int bits = 4;           // 2, 3, 4 or 8
  int group_size = 128;   // -1: one group per row
  bool desc_act = false;  // informational: g_idx decides the column order
  bool zeros_v2 = false;  // checkpoint_format "gptq_v2"
};

// Reads config.json's quantization_config: false when the model is not GPTQ; throws on a GPTQ
// configuration Gyre cannot load (5/6/7-bit, marlin or other packings, bad group sizes).
bool gptq_config_from_hf(const nlohmann::json& config, GptqConfig& out);

// One layer's tensors in Gyre's quantized layout; g_idx may be null. Throws a one-line error on
// any inconsistency of shapes, dtypes, sizes or g_idx values. `name` is used in messages.
QWeightHost gptq_layer_to_qweight(const GptqConfig& c, const std::string& name,
                                  const TensorView& qweight, const TensorView& qzeros,
                                  const TensorView& scales, const TensorView* g_idx);

// The canonical weights of a GPTQ checkpoint whose safetensors tensors are in `raw`: each layer
// P (found by its P.qweight) becomes "P.weight" of dtype QPACKED (a view of its QWeightHost,
// which every backend accepts: the CPU dequantizes it, CUDA uploads it for its 4/8-bit
// kernels and its 2/3-bit split-plane kernels); P's GPTQ tensors are dropped and every other tensor
// (embeddings, norms, biases) is passed through. `out` keeps `raw` (and so its mapped files) alive.
void gptq_load_weights(const GptqConfig& c, std::shared_ptr<const WeightSet> raw, WeightSet& out);

}  // namespace gyre
