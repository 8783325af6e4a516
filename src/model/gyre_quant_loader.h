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
// quantization_config.layers into NAME.weight. Layers at 4 or 8 bits (any group size, sym or
// asym) become DType::QPACKED views of a QWeightHost (backend/cpu/qlinear_ref.h) with the file's
// group size, symmetry and f16 scales, exactly (the CPU dequantizes them, CUDA uploads them for
// its 4/8-bit kernels); 2, 3, 5 and 6 bits are dequantized to F32 at load for now, until kernels
// for them exist. `raw` must outlive `out` (the caller keeps it). Throws gyre::Error with one
// line on any inconsistency.
void gyre_quant_load(const nlohmann::json& config, const WeightSet& raw, WeightSet& out,
                     const std::string& where);

}  // namespace gyre
