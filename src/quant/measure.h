// The measurement pass: for every linear layer of every decoder block and every candidate
// setting, the relative output error tr(E H E^T) / tr(W H W^T) of quantizing it (E = W - Q, H
// the Hessian of its input on the calibration rows). Saved as JSON after each block, so an
// interrupted measurement resumes, and reusable by a later conversion (--measurement).
#pragma once
#include <functional>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/gyre_qformat.h"
#include "model/loader.h"
#include "quant/block_forward.h"

namespace gyre::quant {

// Every setting the optimizer may choose from: 2, 3, 4 bits (sym and asym) and 5, 6, 8 bits
// (sym), each at group sizes 32, 64 and 128, and mixes of two widths (b and b + 1 bits over a
// quarter or half of the groups, and 6 / 8 bits with most groups at 8; measure.cc lists them).
std::vector<QuantSetting> candidate_settings();
// Those that fit a weight of `cols` columns (cols a multiple of the group size; a mix needs at
// least two groups).
std::vector<QuantSetting> settings_for(const std::vector<QuantSetting>& all, int64_t cols);

struct LayerErrors {
  std::string name;  // "model.layers.0.self_attn.q_proj"
  int64_t rows = 0, cols = 0;
  std::vector<std::pair<QuantSetting, double>> errors;
};

// One unit's effect on the model output (sensitivity.h).
struct UnitSensitivity {
  double kl = 0;           // mean KL (nats per token) with only this unit quantized at the probe
  double probe_error = 0;  // summed relative error of the unit's layers at the probe
  double sensitivity() const { return probe_error > 0 ? kl / probe_error : 0.0; }
};

struct Measurement {
  nlohmann::json meta;  // model, rows, length, damp, act_order, method
  int blocks_done = 0;
  std::vector<LayerErrors> layers;
  // By the unit's first layer name; empty when not measured (older files, --chooser plain).
  std::map<std::string, UnitSensitivity> sensitivity;

  const LayerErrors* find(const std::string& name) const;
  nlohmann::json to_json() const;
  static Measurement from_json(const nlohmann::json& j, const std::string& where);
};

class GptqDevice;  // gptq_device.h

// Seconds spent in the heavy linear algebra (UnitQuantizer), for the per-phase report.
struct QuantTimings {
  double hessian = 0;  // Hessians and GPTQ factors
  double gptq = 0;     // GPTQ runs and their error measurement
  // Parts of the phase's time, for finding where it goes: host Hadamard rotations of inputs,
  // weights and results (inside hessian and gptq), the target correction's setup (inside
  // hessian), getting each block's float weights, writing the job's files.
  double rotate = 0, target = 0, weights = 0, write = 0;
};

// "rotations R s, target correction setup T s, ..." of a phase's timings (for its log line).
std::string timing_breakdown(const QuantTimings& t);
void add_timings(QuantTimings& into, const QuantTimings& t);

struct QuantContext {
  const LoadedModel* model = nullptr;
  Backend* backend = nullptr;
  std::vector<std::vector<int>> rows;  // calibration rows, equal lengths
  double damp = 0.01;
  bool act_order = true;
  bool rtn = false;          // round to nearest instead of GPTQ (a baseline)
  bool mixes = true;         // mixes of two widths among the candidates (GPTQ only)
  bool clip_search = false;  // GPTQ group parameters by a clipping search (gptq.h)
  bool hadamard = false;     // rotate every decoder unit's input (quant/hadamard.h)
  // Trellis-coded candidates (gptq_trellis.h) instead of the scalar ones for every rotated unit
  // whose layers tile (implies hadamard; measure.cc says which candidates).
  bool trellis = false;
  // The quantization pass's refinements (not the measurement's): GPTQ toward the corrected
  // target W C H^-1 (target_correction.h), and the group scales refit after GPTQ with the codes
  // fixed (scale_refit.h): 0 off, 1 diagonal Hessian, 2 full Hessian.
  bool target_correction = false;
  bool exact_grid = false;   // ConvertOptions::exact_grid
  double target_damp = 0.1;  // the correction's lambda, fraction of the mean Hessian diagonal
  int scale_refit = 0;
  int threads = 1;
  bool progress = true;
  // On the GPU, the measurement (with trellis) and the sensitivity pass work on the units of a
  // block at once, units on quantizers of their own (GptqDevice::another) on other host threads;
  // false: one unit at a time (the same numbers, up to float64 summation order).
  bool parallel_units = true;
  GptqDevice* gpu = nullptr;        // not null: GPTQ and Hessians on this GPU (not for rtn)
  QuantTimings* timings = nullptr;  // not null: accumulates the linear algebra's seconds
  // A model without weight files (synthetic): each block's weights and the embedding rows of
  // calibration rows come from these instead of model->weights.
  std::function<BlockWeights(int layer)> blocks;
  std::function<std::vector<float>(const std::vector<std::vector<int>>& rows)> embed;
};

// Block `layer`'s weights as floats, from ctx.blocks or the model's weights.
BlockWeights block_of(const QuantContext& ctx, int layer);
// Blocks first .. end - 1 in order (block_of), each made on a second thread while the caller
// works on the one before (at the 8B shape a block is 218M floats, ~0.6 s to generate or
// dequantize); the wait for one counts in ctx.timings->weights.
class BlockPrefetch {
 public:
  BlockPrefetch(const QuantContext& ctx, int first, int end);
  BlockPrefetch(const BlockPrefetch&) = delete;
  BlockPrefetch& operator=(const BlockPrefetch&) = delete;
  ~BlockPrefetch();
  BlockWeights next();

 private:
  const QuantContext& ctx_;
  int at_, end_;
  std::future<BlockWeights> pending_;
};

// The input width of linear layer `suffix` ("self_attn.o_proj", ...) from the config alone.
int64_t linear_cols(const ModelConfig& c, const std::string& suffix);
// Its output width (rows), likewise.
int64_t linear_rows(const ModelConfig& c, const std::string& suffix);

// Whether a unit whose layers have these rows and `cols` input columns is trellis-coded in a
// conversion with --trellis (`trellis`): it is rotated (a Hadamard block divides cols) and every
// layer tiles into 16 x 16. The whole unit or none of it, so its layers still share a setting.
bool trellis_unit(bool trellis, const std::vector<int64_t>& rows, int64_t cols);
// The trellis candidates of such a unit: K = 2, 3, 4, 5, 6, 8 at the rotation's block.
std::vector<QuantSetting> trellis_candidates(int64_t cols);

// The embedding rows of the calibration tokens: the first block's input [rows * length, dim].
std::vector<float> embed_rows(const QuantContext& ctx);

// The upper-triangle-accumulated Hessian 2/N X^T X of x [tokens, n].
std::vector<double> hessian_of(const std::vector<float>& x, int64_t tokens, int n, int threads);

// Runs (or resumes: `m` holds the blocks already done) the measurement; after each block calls
// save(m). Layers whose width fits no candidate are left out.
void measure(const QuantContext& ctx, Measurement& m,
             const std::function<void(const Measurement&)>& save);

}  // namespace gyre::quant
