#include "quant/unit_quant.h"

#include <chrono>

#include "core/error.h"
#include "quant/gptq_device.h"
#include "quant/hadamard.h"
#include "quant/scale_refit.h"
#include "quant/target_correction.h"

namespace gyre::quant {

namespace {

// Adds the seconds from construction to destruction into *into (when not null).
class ScopedSeconds {
 public:
  explicit ScopedSeconds(double* into) : into_(into), t0_(std::chrono::steady_clock::now()) {}
  ~ScopedSeconds() {
    if (into_ != nullptr)
      *into_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  double* into_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

void UnitQuantizer::set_input(const std::vector<float>& x_in, int64_t tokens,
                              const std::string& unit, const std::vector<float>* x_fp_in) {
  GYRE_CHECK(tokens > 0 && x_in.size() % static_cast<size_t>(tokens) == 0,
             "internal: unit input size mismatch");
  ScopedSeconds timer(ctx_.timings ? &ctx_.timings->hessian : nullptr);
  n_ = static_cast<int>(static_cast<int64_t>(x_in.size()) / tokens);
  rot_ = ctx_.hadamard && !unit.empty() ? unit_rotation(unit, n_) : HadamardRotation{};
  // The Hessian of the rotated input is R^T H R: rotating the rows of x first gives it (in
  // float64 by hessian_of, on either device) without another n^3 product.
  std::vector<float> rotated;
  const std::vector<float>& x = in_rotated_space(x_in, rotated);
  corrected_ = false;
  cross_.clear();
  factor_ = DampedFactor{};
  if (on_gpu()) {
    ctx_.gpu->set_input(x.data(), tokens, n_, ctx_.damp, ctx_.act_order, ctx_.clip_search);
    h_.clear();
    prep_ready_ = false;
  } else {
    h_ = hessian_of(x, tokens, n_, ctx_.threads);
    prep_ = GptqPrep{};
    if (!ctx_.rtn) prep_ = gptq_prepare(h_, n_, ctx_.damp, ctx_.act_order);
    prep_.clip_search = ctx_.clip_search;
    prep_ready_ = true;
  }
  if (refine_ && ctx_.target_correction && x_fp_in != nullptr) {
    GYRE_CHECK(x_fp_in->size() == x_in.size(), "internal: original unit input size mismatch");
    // In float64 on either path: on the host it costs tokens * n^2 per unit, the dominant cost
    // at 8B widths, so the GPU path keeps C and the factor on the device. A rotated unit's
    // original input is rotated alike, so C and H are both in the rotated space.
    std::vector<float> fp_rotated;
    const std::vector<float>& x_fp = in_rotated_space(*x_fp_in, fp_rotated);
    if (on_gpu()) {
      ctx_.gpu->set_target(x_fp.data(), x.data(), tokens, ctx_.target_damp);
    } else {
      cross_ = cross_covariance(x_fp, x, tokens, n_, ctx_.threads);
      factor_ = damped_factor(h_, n_, ctx_.target_damp);
    }
    corrected_ = true;
  }
}

void UnitQuantizer::ensure_host_hessian() {
  if (h_.empty()) h_ = ctx_.gpu->hessian();
}

void UnitQuantizer::ensure_cpu_prep() {
  if (prep_ready_) return;
  ensure_host_hessian();
  prep_ = gptq_prepare(h_, n_, ctx_.damp, ctx_.act_order);
  prep_.clip_search = ctx_.clip_search;
  prep_ready_ = true;
}

QuantizedWeight UnitQuantizer::quantize_cpu(const std::vector<float>& w,
                                            const QuantSetting& st) const {
  const int rows = static_cast<int>(static_cast<int64_t>(w.size()) / n_);
  return ctx_.rtn ? rtn_quantize(w.data(), rows, n_, st)
                  : gptq_quantize(w.data(), rows, n_, prep_, st, ctx_.threads);
}

const std::vector<float>& UnitQuantizer::in_rotated_space(const std::vector<float>& m,
                                                          std::vector<float>& rotated) const {
  if (!rot_.active()) return m;
  rotated = m;
  hadamard_rotate_rows(rotated.data(), static_cast<int64_t>(m.size()) / n_, n_, rot_);
  return rotated;
}

std::vector<double> UnitQuantizer::errors(const std::vector<float>& w_in,
                                          const std::vector<QuantSetting>& settings) {
  GYRE_CHECK(n_ > 0 && w_in.size() % static_cast<size_t>(n_) == 0,
             "internal: weight width mismatch");
  ScopedSeconds timer(ctx_.timings ? &ctx_.timings->gptq : nullptr);
  std::vector<float> rotated;
  const std::vector<float>& w = in_rotated_space(w_in, rotated);
  const int rows = static_cast<int>(static_cast<int64_t>(w.size()) / n_);
  std::vector<QuantSetting> plain;
  for (const QuantSetting& st : settings)
    if (!on_gpu() || !st.mixed()) plain.push_back(st);
  std::vector<double> plain_errors;
  if (on_gpu()) {
    plain_errors = ctx_.gpu->errors(w.data(), rows, plain);
  } else {
    for (const QuantSetting& st : plain)
      plain_errors.push_back(relative_error(w.data(), quantize_cpu(w, st), h_, ctx_.threads));
  }
  if (plain.size() == settings.size()) return plain_errors;
  ensure_cpu_prep();  // mixed settings on the GPU path
  std::vector<double> out;
  size_t next_plain = 0;
  for (const QuantSetting& st : settings) {
    if (!st.mixed()) {
      out.push_back(plain_errors[next_plain++]);
    } else {
      out.push_back(relative_error(w.data(), quantize_cpu(w, st), h_, ctx_.threads));
    }
  }
  return out;
}

QuantizedWeight UnitQuantizer::quantize(const std::vector<float>& w_in, const QuantSetting& st,
                                        double* rel_error) {
  GYRE_CHECK(n_ > 0 && w_in.size() % static_cast<size_t>(n_) == 0,
             "internal: weight width mismatch");
  ScopedSeconds timer(ctx_.timings ? &ctx_.timings->gptq : nullptr);
  std::vector<float> rotated;
  const std::vector<float>& w_rot = in_rotated_space(w_in, rotated);
  const int rows = static_cast<int>(static_cast<int64_t>(w_rot.size()) / n_);
  std::vector<float> corrected;
  if (corrected_)
    corrected = on_gpu() ? ctx_.gpu->corrected_target(w_rot.data(), rows)
                         : corrected_target(w_rot, n_, cross_, factor_, ctx_.threads);
  const std::vector<float>& w = corrected_ ? corrected : w_rot;
  const bool refit = refine_ && ctx_.scale_refit != 0 && !ctx_.rtn;
  QuantizedWeight q;
  if (on_gpu() && !st.mixed()) {
    q = ctx_.gpu->quantize(w.data(), rows, st, rel_error);
  } else {
    if (on_gpu()) ensure_cpu_prep();
    q = quantize_cpu(w, st);
    if (rel_error != nullptr && !refit) *rel_error = relative_error(w.data(), q, h_, ctx_.threads);
  }
  if (refit) {  // codes fixed; in the space GPTQ worked in (rotated, when the unit is)
    ensure_host_hessian();
    const RefitResult r = refit_scales(w.data(), q, h_, ctx_.scale_refit == 1, ctx_.threads);
    refit_before_ += r.error_before;
    refit_after_ += r.error_after;
    if (rel_error != nullptr) *rel_error = relative_error(w.data(), q, h_, ctx_.threads);
  }
  if (rot_.active()) {  // the error is invariant under R; the layer's floats are unrotated
    q.had = rot_;
    hadamard_unrotate_rows(q.dequant.data(), rows, n_, rot_);
  }
  return q;
}

}  // namespace gyre::quant
