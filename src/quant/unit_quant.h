// GPTQ (or round to nearest) of the linear layers that share one input, on the CPU (gptq.h) or
// on the GPU (gptq_device.h) as the context says: the one place measure, the sensitivity pass
// and the quantization pass call for the heavy linear algebra.
#pragma once
#include <string>
#include <vector>

#include "backend/cpu/hadamard.h"
#include "quant/gptq.h"
#include "quant/measure.h"

namespace gyre::quant {

class UnitQuantizer {
 public:
  explicit UnitQuantizer(const QuantContext& ctx) : ctx_(ctx) {}
  // The unit's input x [tokens, n]: its Hessian (and GPTQ's factor unless ctx.rtn). With
  // ctx.hadamard and a unit name (its first layer's, quant/hadamard.h) the unit is rotated: the
  // Hessian is that of R^T x and every weight is quantized as W R; the QuantizedWeight then
  // carries the rotation and its dequant is the effective (W R)_q R^T in the original space.
  void set_input(const std::vector<float>& x, int64_t tokens, const std::string& unit = {});
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

  // w, or w R when the unit is rotated (in `rotated`).
  const std::vector<float>& weight_in(const std::vector<float>& w,
                                      std::vector<float>& rotated) const;

  const QuantContext& ctx_;
  int n_ = 0;
  HadamardRotation rot_;
  std::vector<double> h_;  // CPU only
  GptqPrep prep_;
};

}  // namespace gyre::quant
