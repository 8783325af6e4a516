// The second half of `gyre convert` (convert.h): the quantization pass over the chosen plan and
// the output folder.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "quant/convert.h"
#include "quant/gptq.h"
#include "quant/measure.h"
#include "quant/st_writer.h"

namespace gyre::quant {

// Linear layer name (no ".weight"; the LM head is "lm_head") -> its setting.
using Plan = std::map<std::string, QuantSetting>;

// The per-unit choice under bpw (optimizer.h): minimizes the summed relative errors, each unit's
// weighted by its measured sensitivity when `weighted` and the measurement has them.
Plan optimized_plan(const LoadedModel& m, const Measurement& meas, double bpw, bool weighted);

// quantization_config.version of a file holding the plan's layers (quant_format_version).
int plan_format_version(const Plan& plan, bool hadamard);

// NAME.qweight / NAME.scales (/ NAME.mins, NAME.had_signs; a trellis layer's tiles) in the
// model/gyre_qformat.h layout.
std::vector<StTensor> pack_tensors(const QuantizedWeight& q, const std::string& name);

// quantization_config.layers: {name: {bits, group_size, sym, shape}} (+ "hadamard": B for the
// decoder's layers when `hadamard`, "trellis": true for trellis-coded ones); shapes from m's
// tensors, or from its config for layers it has no tensor of (synthetic blocks).
nlohmann::json plan_layers_json(const Plan& plan, const LoadedModel& m, bool hadamard = false);

// Quantizes block by block into OUT/.gyre-job/block_N.safetensors (existing files are reused:
// resume), then the LM head (head_bits 0: none) into head.safetensors.
void quantize_pass(const QuantContext& ctx, Plan& plan, const std::string& job, int head_bits);

// Writes model.safetensors, config.json, the tokenizer files and measurement.json into o.out,
// then checks that the folder loads.
void write_output(const QuantContext& ctx, const ConvertOptions& o, const Plan& plan,
                  const std::string& job, const nlohmann::json& in_config,
                  const Measurement* measurement);

}  // namespace gyre::quant
