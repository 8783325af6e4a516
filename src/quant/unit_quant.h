// GPTQ (or round to nearest) of the linear layers that share one input, on the CPU (gptq.h) or
// on the GPU (gptq_device.h) as the context says: the one place measure, the sensitivity pass
// and the quantization pass call for the heavy linear algebra.
#pragma once
#include <vector>

#include "quant/gptq.h"
#include "quant/measure.h"

namespace gyre::quant {

class UnitQuantizer {
 public:
  explicit UnitQuantizer(const QuantContext& ctx) : ctx_(ctx) {}
  // The unit's input x [tokens, n]: its Hessian (and GPTQ's factor unless ctx.rtn).
  void set_input(const std::vector<float>& x, int64_t tokens);
  int width() const { return n_; }
  // Relative error tr(E H E^T) / tr(W H W^T) of w [rows, n] quantized at each setting.
  std::vector<double> errors(const std::vector<float>& w, const std::vector<QuantSetting>& st);
  QuantizedWeight quantize(const std::vector<float>& w, const QuantSetting& st, double* rel_error);

 private:
  bool on_gpu() const { return ctx_.gpu != nullptr && !ctx_.rtn; }
  QuantizedWeight quantize_cpu(const std::vector<float>& w, const QuantSetting& st) const;
  // Mixed settings (per-group widths) have no GPU GPTQ: on the GPU path the CPU quantizes them
  // from the device's Hessian, fetched once per input.
  void ensure_cpu_prep();

  const QuantContext& ctx_;
  int n_ = 0;
  std::vector<double> h_;  // CPU only
  GptqPrep prep_;
};

}  // namespace gyre::quant
