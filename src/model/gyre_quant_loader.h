// Loading a model written by `gyre convert` (config.json quantization_config.quant_method "gyre"):
// the packed tensors of model/gyre_qformat.h become ordinary weights under canonical names.
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "model/weights.h"

namespace gyre {

// True when the config's quantization_config says quant_method "gyre".
bool is_gyre_quantized(const nlohmann::json& config);

// Copies every plain tensor of `raw` into `out` and turns each layer listed in
// quantization_config.layers into NAME.weight. Layers at 4 bits (any group size, sym or asym)
// and 8 bits symmetric become Q4_0 / Q4_1 / Q8_0 blocks (the group's scale repeated per 32
// columns: exact), which every backend already runs (CUDA repacks them into its 4/8-bit kernel
// layout); 2, 3, 5 and 6 bits (and 8-bit asymmetric) are dequantized to F32 at load for now,
// until kernels for them exist. `raw` must outlive `out` (the caller keeps it). Throws
// gyre::Error with one line on any inconsistency.
void gyre_quant_load(const nlohmann::json& config, const WeightSet& raw, WeightSet& out,
                     const std::string& where);

}  // namespace gyre
