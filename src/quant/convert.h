// `gyre convert`: a Hugging Face model folder in, a Gyre-quantized folder out (config.json with
// a quantization_config block, model.safetensors or shards of it with their index in the
// model/gyre_qformat.h layout, the tokenizer files, measurement.json). Steps: calibration rows;
// measurement of every layer at every candidate setting (measure.h); the per-layer choice under the
// bits-per-weight target (optimizer.h); the quantization pass, block by block, each block fed the
// outputs of the already-quantized blocks before it. Job state lives in OUT/.gyre-job, so an
// interrupted conversion started again with the same options resumes where it stopped.
#pragma once
#include <cstdint>
#include <string>

namespace gyre::quant {

struct ConvertOptions {
  std::string model, out;
  std::string calibration;  // text file; empty: the built-in text
  std::string measurement;  // reuse this measurement JSON instead of measuring
  double bpw = 4.0;         // target average bits per weight of the decoder's linear layers
  // LM head bits (group 128, symmetric); 0 keeps it unquantized; -1: by the target (8 when
  // the target, or the --uniform width, is 6 bits or more, else 6).
  int head_bits = -1;
  int rows = 32, length = 256;
  double damp = 0.01;
  bool act_order = true;
  // How the per-unit choice weighs the measured errors: "kl" (each unit's relative errors times
  // its measured effect on the output KL, sensitivity.h) or "plain" (the unweighted sum).
  std::string chooser = "kl";
  int sensitivity_rows = 8;  // calibration rows the sensitivity pass runs on (its cost)
  // Rotate the residual stream and each KV head's values by random orthogonal matrices folded
  // into the weights before measuring (quant/rotate.h); the output stays a plain Llama.
  bool rotate = false;
  bool clip_search = true;  // GPTQ group scales by a clipping search (gptq.h)
  // Rotate each decoder layer's input by random-sign block Hadamard matrices (quant/hadamard.h):
  // the file stores quant(W R), the backends rotate x at run time (format version 3).
  bool hadamard = false;
  // Trellis-coded layers (gptq_trellis.h, format version 4) for the rotated units whose layers
  // tile into 16 x 16; implies hadamard. The other layers keep the scalar settings.
  bool trellis = false;
  // Quantization pass refinements: GPTQ toward the target corrected for the quantized inputs
  // (target_correction.h); group scales refit after GPTQ, codes fixed (scale_refit.h): "off",
  // "diag" or "full".
  bool target_correction = true;  // default since it won at every target (docs/quantization.md)
  double target_damp = 0.1;       // its regularization toward W (target_correction.h)
  // A layer (or the head, at a smaller group) already on its setting's grid is stored exactly
  // (gptq.h rtn_exact; GGUF sources at their own widths).
  bool exact_grid = true;
  std::string scale_refit = "off";
  // Baselines: every layer at one setting "BITS:GROUP[:asym]" (no measurement), and round to
  // nearest instead of GPTQ.
  std::string uniform;
  bool rtn = false;
  bool mixes = true;  // false: measure one-width candidates only (a shorter measurement)
  int threads = 0;    // <= 0: all cores
  // The output's safetensors shards hold at most this many bytes of tensors each (one file,
  // model.safetensors, when the whole model fits in one; `--shard-mb`).
  uint64_t shard_bytes = uint64_t{4096} << 20;
  // "cpu", "cuda" or "cuda:N": where the block forward, Hessians and GPTQ run; empty: the GPU
  // when Gyre has CUDA and one is present (gptq_device.h), else the CPU.
  std::string device;
  bool progress = true;
};

// The LM head's bits: o.head_bits, or with -1 the default by the target: 8 when the target
// (--bpw, or the --uniform width) is 6 bits or more, else 6 (a 6-bit head alone capped top-1
// agreement at high targets; docs/quantization.md).
int resolved_head_bits(const ConvertOptions& o);

// Runs the whole conversion; prints progress and per-layer errors on stderr. Throws gyre::Error.
void convert_model(const ConvertOptions& o);

}  // namespace gyre::quant
