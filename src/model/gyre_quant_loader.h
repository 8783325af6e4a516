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
// quantization_config.layers into NAME.weight: a DType::QPACKED view of a QWeightHost
// (backend/cpu/qlinear_ref.h) at every width the converter writes (2, 3, 4, 5, 6, 8 bits, any
// group size, sym or asym) and trellis-coded (version 4: the tile words copied as they are),
// with the file's group size, symmetry and f16 scales, exactly (the
// CPU dequantizes them, CUDA uploads them for its kernels). `raw` must outlive `out` (the
// caller keeps it). Throws gyre::Error with one line on any inconsistency.
void gyre_quant_load(const nlohmann::json& config, const WeightSet& raw, WeightSet& out,
                     const std::string& where);

}  // namespace gyre
