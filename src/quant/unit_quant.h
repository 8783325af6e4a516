// GPTQ (or round to nearest) of the linear layers that share one input, on the CPU (gptq.h) or
// on the GPU (gptq_device.h) as the context says: the one place measure, the sensitivity pass
// and the quantization pass call for the heavy linear algebra.
#pragma once
#include <vector>

#include "quant/gptq.h"
#include "quant/measure.h"
#include "quant/target_correction.h"

namespace gyre::quant {

class UnitQuantizer {
 public:
  // refine: apply ctx's quantization-pass refinements (target correction, scale refit); the
  // measurement and the sensitivity probes quantize without them.
  explicit UnitQuantizer(const QuantContext& ctx, bool refine = false)
      : ctx_(ctx), refine_(refine) {}
  // The unit's input x [tokens, n]: its Hessian (and GPTQ's factor unless ctx.rtn). With
  // ctx.target_correction and x_fp (the same tokens' input in the unquantized model), quantize()
  // aims at the corrected target W C H^-1 instead of W (target_correction.h).
  void set_input(const std::vector<float>& x, int64_t tokens,
                 const std::vector<float>* x_fp = nullptr);
  int width() const { return n_; }
  // Relative error tr(E H E^T) / tr(W H W^T) of w [rows, n] quantized at each setting.
  std::vector<double> errors(const std::vector<float>& w, const std::vector<QuantSetting>& st);
  // rel_error: against the target quantized toward (W, or W* with target correction).
  QuantizedWeight quantize(const std::vector<float>& w, const QuantSetting& st, double* rel_error);
  // Summed tr(E H E^T) of the layers quantized so far, before and after the scale refit.
  double refit_error_before() const { return refit_before_; }
  double refit_error_after() const { return refit_after_; }

 private:
  bool on_gpu() const { return ctx_.gpu != nullptr && !ctx_.rtn; }
  QuantizedWeight quantize_cpu(const std::vector<float>& w, const QuantSetting& st) const;
  // Mixed settings (per-group widths) have no GPU GPTQ: on the GPU path the CPU quantizes them
  // from the device's Hessian, fetched once per input.
  void ensure_cpu_prep();
  void ensure_host_hessian();

  const QuantContext& ctx_;
  bool refine_;
  int n_ = 0;
  std::vector<double> h_;  // CPU, or fetched from the GPU when the host needs it
  GptqPrep prep_;
  bool prep_ready_ = false;
  std::vector<double> cross_;  // target correction: C, and the factor of H + lambda I
  DampedFactor factor_;
  double refit_before_ = 0.0, refit_after_ = 0.0;
};

}  // namespace gyre::quant
