// `gyre convert --synthetic NAME`: the whole conversion (measurement of every candidate, the
// per-layer choice, the quantization pass) on a model of a known shape with random weights, to
// time the quantizer without a checkpoint. Each block's weights are generated when the block is
// reached (deterministic per layer and tensor), so memory holds one block at a time; the
// calibration rows are random token ids (there is no tokenizer). With --head-bits > 0 a random
// untied LM head (and final norm) is quantized too, with the Hessian of the last block's outputs,
// as in a real conversion. The output folder gets the measurement and a summary
// (conversion.json), not a loadable model: there is no embedding or tokenizer to write.
#pragma once
#include <string>

#include "model/config.h"
#include "quant/block_forward.h"
#include "quant/convert.h"

namespace gyre::quant {

// c: the shape (cli's synthetic_config); o: the options (model is ignored, out required).
void convert_synthetic(const ModelConfig& c, const std::string& name, const ConvertOptions& o);

// Deterministic pseudo-random block weights of shape c: matrices uniform in +-sqrt(3 / cols)
// (unit-variance outputs for unit-variance inputs, never all zero), norms near 1.
BlockWeights synthetic_block(const ModelConfig& c, int layer, int threads);

}  // namespace gyre::quant
