// The MLP's hidden units renumbered into an act-order down_proj's column order, at load.
//
// An act-order down_proj (GPTQ desc_act, EXL2, Gyre's converter) stores column j from input P[j],
// so every call gathers its input through P. The hidden units can be renumbered instead, exactly:
// with gate and up rows in P's order, SwiGLU's output arrives in down_proj's stored column order
// and down_proj drops P. On CUDA the gather in the decode GEMV's staging cost ~4.5 us of the
// down projection's ~17 us (H100, Llama-3-8B shape, bench/NOTES.md session 15).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/qlinear_ref.h"
#include "core/tensor.h"

namespace gyre {

struct MlpInDownOrder {
  QWeightHost gate, up, down;
  // Views of the rewritten weights under the original names; valid while this object lives.
  std::vector<TensorView> gate_up_views(const std::string& gate_name,
                                        const std::string& up_name) const;
  TensorView down_view(const std::string& name) const;
};

// The rewritten weights, or nothing when there is nothing to gain or it cannot be done: down is
// not a packed act-order weight (or is rotated or trellis-coded; mixes of widths are left alone),
// or gate or up is not a packed weight of down's column count whose rows can be permuted (trellis).
std::optional<MlpInDownOrder> mlp_in_down_order(const TensorView& gate, const TensorView& up,
                                                const TensorView& down);

}  // namespace gyre
