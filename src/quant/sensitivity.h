// How much each unit's quantization error moves the model's output. The measurement (measure.h)
// gives every layer's relative output error tr(E H E^T) / tr(W H W^T) at every setting, but an
// error of 0.01 in layer 0's MLP costs more KL at the output than the same error in the last
// block's o_proj. So for every unit (q|k|v, o, gate|up, down of one block) this pass quantizes
// only that unit, at one probe setting (GPTQ), runs the rest of the model unquantized, and
// measures the mean KL(original || perturbed) of the next-token distributions over calibration
// rows. The unit's sensitivity is that KL divided by the summed relative error of its layers at
// the probe; the optimizer then minimizes sum(sensitivity * relative error), a first-order
// estimate of the KL of the whole quantized model (small independent perturbations add).
#pragma once
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "model/gyre_qformat.h"
#include "quant/measure.h"

namespace gyre::quant {

// The probe convert uses: 3 bits, group 128, symmetric (strong enough that every unit's KL is
// well above rounding noise, small enough to stay near the first-order regime).
inline constexpr QuantSetting kSensitivityProbe{3, 128, true};

// Keyed by the unit's first layer name ("model.layers.3.mlp.gate_proj"); a unit whose width the
// probe's group does not divide is probed at the widest of its group / 2 / 4 (down to 32) that
// does, and left out when none does. Uses the first `max_rows` calibration rows of ctx (fewer
// when ctx has fewer). Memory: one block's float weights at a time (two while the next one is
// read from the mapped file, or generated, on a second thread), the final norm and the head;
// each unit's perturbed hidden states [rows * length, dim] stay on the backend while they fit
// `stream_budget_bytes` (the rest wait on the host between blocks).
inline constexpr size_t kSensitivityStreamBudget = size_t{12} << 30;
std::map<std::string, UnitSensitivity> measure_sensitivity(
    const QuantContext& ctx, const QuantSetting& probe, int max_rows,
    size_t stream_budget_bytes = kSensitivityStreamBudget);

// Device memory in use now (total - free) on the GPU the quantizer uses; 0 without CUDA.
size_t backend_memory_used();

// Mean KL(p || q) per row of two logit matrices [n, vocab], in double precision, rows split over
// `threads` (on the GPU path this was the sensitivity pass's largest cost).
double mean_kl_of_logits(const std::vector<float>& ref_logits, const std::vector<float>& logits,
                         int64_t vocab, int threads = 1);

}  // namespace gyre::quant
