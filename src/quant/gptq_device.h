// The quantizer's heavy linear algebra on a GPU (quant/cuda/, built only with CUDA): per unit
// input, the Hessian 2/N X^T X and GPTQ's factor (hessian_of + gptq_prepare in gptq.h); per
// linear weight, GPTQ at every candidate setting with its relative output error (what
// measure() and the quantization pass need), in float64 like the CPU code. The CPU functions
// stay the reference: the results match them up to summation order (tests/test_quant_cuda.cc).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/gyre_qformat.h"
#include "quant/gptq.h"

namespace gyre::quant {

class GptqDevice {
 public:
  virtual ~GptqDevice() = default;
  // A second quantizer on the same GPU with its own stream and buffers, for work on another host
  // thread (each device object is used by one thread at a time).
  virtual std::unique_ptr<GptqDevice> another() const = 0;
  // The unit's input x [tokens, n] (host floats): its Hessian and GPTQ's factor, kept on the
  // device for the weights that follow. Throws gyre::Error when H cannot be factored.
  virtual void set_input(const float* x, int64_t tokens, int n, double damp, bool act_order,
                         bool clip_search) = 0;
  // [n x n]: for tests and the scale refit (unit_quant.h)
  virtual std::vector<double> hessian() const = 0;
  virtual double damp_used() const = 0;
  // Target correction (target_correction.h) on the device: C = 2/N x_fp^T x_q from x_fp, the
  // same tokens' input in the unquantized model, and x_q, the input given to set_input (host
  // floats, [tokens, n]), and the Cholesky factor of H + lambda I, all kept on the device.
  // Returns lambda (as damped_factor). Valid until the next set_input.
  virtual double set_target(const float* x_fp, const float* x_q, int64_t tokens,
                            double target_damp) = 0;
  virtual std::vector<double> cross_covariance() const = 0;  // C [n x n], for tests
  // W* [rows, n] = W (C + lambda I)(H + lambda I)^-1 of w [rows, n] (host floats).
  virtual std::vector<float> corrected_target(const float* w, int rows) = 0;
  // tr(E H E^T) / tr(W H W^T) of GPTQ at each setting for w [rows, n] (host floats); a mix of two
  // widths quantizes the groups mix_hi_groups picks from H's diagonal at mix_bits. A trellis
  // setting (st.trellis) runs the trellis LDLQ of quant/gptq_trellis.h instead, in the natural
  // column order whatever set_input's act_order (quant/cuda/trellis_ldlq.h).
  virtual std::vector<double> errors(const float* w, int rows,
                                     const std::vector<QuantSetting>& settings) = 0;
  // GPTQ at one setting with its stored integers, scales and dequantized values (a trellis
  // setting: the tiles' words in QuantizedWeight::trellis, q empty, as gptq_quantize_trellis).
  virtual QuantizedWeight quantize(const float* w, int rows, const QuantSetting& st,
                                   double* rel_error) = 0;
  // Several weights of one input at once, each ws[i] [rows, n] (host floats), every (weight,
  // trellis setting) pair stacked into one LDLQ sweep so that small weights fill the GPU; the
  // results of separate calls. trellis_errors: out[i][j] = errors(ws[i], {settings[j]}).
  virtual std::vector<std::vector<double>> trellis_errors(
      const std::vector<const float*>& ws, int rows, const std::vector<QuantSetting>& settings) = 0;
  // out[i] = quantize(ws[i], settings[i]) (trellis settings of one group), rel_errors[i] its error.
  virtual std::vector<QuantizedWeight> quantize_trellis(const std::vector<const float*>& ws,
                                                        int rows,
                                                        const std::vector<QuantSetting>& settings,
                                                        std::vector<double>* rel_errors) = 0;
};

// "cuda" or "cuda:N". Throws gyre::Error without CUDA or without that device.
std::unique_ptr<GptqDevice> make_gptq_device(const std::string& device);

// The device convert uses by default: "cuda" when Gyre was built with CUDA and a GPU is
// present, else "cpu".
std::string default_quant_device();

}  // namespace gyre::quant
