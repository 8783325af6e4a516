// The quantizer's side of per-layer Hadamard rotations (`gyre convert --hadamard`; the algebra
// and the file format are in backend/cpu/hadamard.h and model/gyre_qformat.h). Each unit (the
// layers sharing one input: q|k|v, o, gate|up, down) gets its own random signs, a fixed function
// of the unit's name, so the measurement, the sensitivity pass and the quantization pass (and a
// resumed job) rotate a unit alike, and the unit's layers still fuse at run time.
#pragma once
#include <cstdint>
#include <string>

#include "backend/cpu/hadamard.h"

namespace gyre::quant {

// The rotation of unit `unit` (its first layer's name, e.g. "model.layers.3.self_attn.q_proj")
// with cols input columns: block hadamard_block_for(cols) (none when 0), signs seeded by the name.
HadamardRotation unit_rotation(const std::string& unit, int64_t cols);

}  // namespace gyre::quant
