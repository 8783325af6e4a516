// GPTQ (or round to nearest) of the linear layers that share one input, on the CPU (gptq.h) or
// on the GPU (gptq_device.h) as the context says: the one place measure, the sensitivity pass
// and the quantization pass call for the heavy linear algebra.
#pragma once
#include <string>
#include <vector>

#include "backend/cpu/hadamard.h"
#include "quant/gptq.h"
#include "quant/measure.h"
#include "quant/target_correction.h"

namespace gyre::quant {

// Trellis candidates of a weight with more rows are measured on this many (UnitQuantizer::errors).
inline constexpr int kTrellisMeasureRows = 256;

class UnitQuantizer {
 public:
  // refine: apply ctx's quantization-pass refinements (target correction, scale refit); the
  // measurement and the sensitivity probes quantize without them.
  explicit UnitQuantizer(const QuantContext& ctx, bool refine = false)
      : ctx_(ctx), refine_(refine) {}
  // The unit's input x [tokens, n]: its Hessian (and GPTQ's factor unless ctx.rtn). With
  // ctx.hadamard and a unit name (its first layer's, quant/hadamard.h) the unit is rotated: the
  // Hessian is that of R^T x and every weight is quantized as W R; the QuantizedWeight then
  // carries the rotation and its dequant is the effective (W R)_q R^T in the original space.
  // With ctx.target_correction (and refine) and x_fp, the same tokens' input in the unquantized
  // model, quantize() aims at the corrected target W* = W (C + lambda I)(H + lambda I)^-1
  // instead of W (target_correction.h; in the rotated space when the unit is rotated).
  void set_input(const std::vector<float>& x, int64_t tokens, const std::string& unit = {},
                 const std::vector<float>* x_fp = nullptr);
  int width() const { return n_; }
  // Relative error tr(E H E^T) / tr(W H W^T) of w [rows, n] quantized at each setting. Trellis
  // settings of a weight with more than kTrellisMeasureRows rows are measured on that many rows
  // (evenly spaced 16-row tiles): an estimate of the same ratio at a fraction of the Viterbi cost.
  std::vector<double> errors(const std::vector<float>& w, const std::vector<QuantSetting>& st);
  // rel_error: against the target quantized toward (W, or W* with target correction). Trellis
  // settings need a rotated unit whose weights tile into 16 x 16 (else gyre::Error); they get no
  // scale refit.
  QuantizedWeight quantize(const std::vector<float>& w, const QuantSetting& st, double* rel_error);
  // Several weights of the unit at once, with the results of one call per weight: out[i] =
  // errors(*ws[i], st), and quantize(*ws[i], settings[i], &rel_errors[i]). On the GPU, weights
  // of one shape at trellis settings (of one group) are stacked into one LDLQ sweep.
  std::vector<std::vector<double>> errors_many(const std::vector<const std::vector<float>*>& ws,
                                               const std::vector<QuantSetting>& st);
  std::vector<QuantizedWeight> quantize_many(const std::vector<const std::vector<float>*>& ws,
                                             const std::vector<QuantSetting>& settings,
                                             std::vector<double>& rel_errors);
  // Summed tr(E H E^T) of the layers quantized so far, before and after the scale refit.
  double refit_error_before() const { return refit_before_; }
  double refit_error_after() const { return refit_after_; }

 private:
  bool on_gpu() const { return ctx_.gpu != nullptr && !ctx_.rtn; }
  QuantizedWeight quantize_cpu(const std::vector<float>& w, const QuantSetting& st) const;
  // The one place trellis settings are quantized (w in the rotated space): LDLQ on the GPU when
  // there is one (GptqDevice::quantize), else on the CPU (gptq_trellis.h) with its own
  // natural-order factor of H; rel_error (if not null) = relative_error against w.
  QuantizedWeight quantize_trellis(const std::vector<float>& w, const QuantSetting& st,
                                   double* rel_error);
  void check_trellis(int64_t rows, const QuantSetting& st) const;
  // w rotated and, with target correction, corrected: what quantize() quantizes (a copy).
  std::vector<float> quantization_target(const std::vector<float>& w_in);
  // The rows of w a trellis measurement runs on: w itself, or kTrellisMeasureRows of them (into
  // sub) spread over the weight.
  const std::vector<float>& trellis_sample(const std::vector<float>& w,
                                           std::vector<float>& sub) const;
  // On the GPU path, the device's Hessian fetched once per input (for the scale refit).
  void ensure_host_hessian();

  // Rows of n_ values (a weight, or the unit's input tokens) as GPTQ sees them: m itself, or
  // m R when the unit is rotated (then held in `rotated`).
  const std::vector<float>& in_rotated_space(const std::vector<float>& m,
                                             std::vector<float>& rotated) const;

  const QuantContext& ctx_;
  bool refine_;
  int n_ = 0;
  HadamardRotation rot_;
  std::vector<double> h_;  // CPU, or fetched from the GPU when the host needs it
  GptqPrep prep_;
  bool prep_ready_ = false;
  GptqPrep trellis_prep_;  // LDLQ's factor: natural column order whatever ctx.act_order says
  bool trellis_prep_ready_ = false;
  // Target correction: on the CPU path C and the factor of H + lambda I; on the GPU path both
  // stay on the device (GptqDevice::set_target).
  bool corrected_ = false;
  std::vector<double> cross_;
  DampedFactor factor_;
  double refit_before_ = 0.0, refit_after_ = 0.0;
};

}  // namespace gyre::quant
