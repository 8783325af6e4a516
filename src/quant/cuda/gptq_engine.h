// The GPU half of quant/gptq_device.h, in C++17 (nvcc compiles the .cu files as C++17, so this
// header uses no gyre_qformat.h types). quant/gptq_device.cc wraps it.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

namespace gyre::quant::cuda {

// One candidate. A mix of two widths (model/gyre_qformat.h) names the groups quantized at
// mix_bits instead of bits (the caller picks them: mix_hi_groups of hessian_diagonal()).
struct Setting {
  int bits, group, sym;  // group 32, 64 or 128
  int mix_bits = 0;      // 0: one width
  std::vector<int> hi_groups;
};

class Engine {
 public:
  explicit Engine(int ordinal);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  // Makes the engine's GPU the calling host thread's current device (cudaSetDevice is per
  // thread): an engine used from a thread other than its creator's calls this first.
  void make_current() const;
  // See GptqDevice::set_input.
  void set_input(const float* x, int64_t tokens, int n, double damp, bool act_order,
                 bool clip_search);
  std::vector<double> hessian() const;
  // H's diagonal with a zero entry (a dead column) counted as 1, as GptqPrep::hdiag.
  const std::vector<double>& hessian_diagonal() const;
  double damp_used() const;
  // Target correction (GptqDevice::set_target): C from x_fp and x_q (the input of the last
  // set_input), the factor of H + lambda I; returns lambda.
  double set_target(const float* x_fp, const float* x_q, int64_t tokens, double target_damp);
  std::vector<double> cross() const;  // C, row-major [n x n] (for tests)
  // out [rows, n] = the corrected target of w [rows, n] (host floats).
  void corrected_target(const float* w, int rows, float* out);
  // Uploads w [rows, n]; returns tr(W H W^T).
  double set_weight(const float* w, int rows);
  // Uploads `count` weights ws[i] [rows, n] (trellis_stack quantizes them together; run() and
  // trellis() need one); tr(W H W^T) of each.
  std::vector<double> set_weights(const float* const* ws, int count, int rows);
  // GPTQ of the weight at each setting (stacked, in batches bounded in memory); tr(E H E^T) of
  // each. With want_outputs (one setting), fetch() then gives its results.
  std::vector<double> run(const std::vector<Setting>& settings, bool want_outputs);
  // Row-major [rows, n] dequantized values and stored integers, [rows, n / group] scales and
  // mins of the last run.
  void fetch(float* dequant, uint8_t* q, float* scales, float* mins);
  // Trellis LDLQ (quant/gptq_trellis.h, natural column order whatever set_input's act_order) of
  // the weight of the last set_weight at K = k bits, scale groups of `group` columns; returns
  // tr(E H E^T). fetch_trellis then gives row-major [rows, n] dequantized values, [rows, n /
  // group] scales and the tiles' words ([rows / 16][n / 16][8K]).
  double trellis(int k, int group, double scale_fit);
  // tr(E H E^T) of the trellis LDLQ at each K of ks (as trellis(), the results of separate
  // calls), stacked in one sweep so that a small weight still fills the GPU; no outputs to fetch.
  std::vector<double> trellis_errors(const std::vector<int>& ks, int group, double scale_fit);
  // Candidate c: weight weight_of[c] of the last set_weights at K = ks[c], all stacked in one
  // sweep (as separate trellis() calls would give them); tr(E H E^T) of each. With keep (the
  // stack must fit one batch), fetch_trellis_of(c) then gives candidate c's outputs as
  // fetch_trellis does.
  std::vector<double> trellis_stack(const std::vector<int>& ks, const std::vector<int>& weight_of,
                                    int group, double scale_fit, bool keep);
  void fetch_trellis_of(int c, float* dequant, float* scales, uint32_t* words);
  void fetch_trellis(float* dequant, float* scales, uint32_t* words);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

int device_count();

}  // namespace gyre::quant::cuda
