#include "quant/unit_quant.h"

#include <chrono>

#include "backend/cpu/trellis.h"
#include "core/error.h"
#include "quant/gptq_device.h"
#include "quant/gptq_trellis.h"
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
  trellis_prep_ready_ = false;
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

QuantizedWeight UnitQuantizer::quantize_cpu(const std::vector<float>& w,
                                            const QuantSetting& st) const {
  const int rows = static_cast<int>(static_cast<int64_t>(w.size()) / n_);
  return ctx_.rtn ? rtn_quantize(w.data(), rows, n_, st)
                  : gptq_quantize(w.data(), rows, n_, prep_, st, ctx_.threads);
}

QuantizedWeight UnitQuantizer::quantize_trellis(const std::vector<float>& w, const QuantSetting& st,
                                                double* rel_error) {
  const int64_t rows = static_cast<int64_t>(w.size()) / n_;
  GYRE_CHECK(rot_.active(), "trellis ", st.str(), ": the layer's unit is not rotated (trellis ",
             "layers need --hadamard and a width with a Hadamard block)");
  GYRE_CHECK(trellis_tileable(rows, n_), "trellis ", st.str(), ": a [", rows, ", ", n_,
             "] weight is not made of 16 x 16 tiles");
  GYRE_CHECK(st.group_size == rot_.block, "trellis ", st.str(), ": the group must be the ",
             "rotation's block ", rot_.block);
  // The same LDLQ on the device (quant/cuda/trellis_ldlq.h), error measured there too.
  if (on_gpu()) return ctx_.gpu->quantize(w.data(), static_cast<int>(rows), st, rel_error);
  ensure_host_hessian();  // the CPU path has it already
  if (!trellis_prep_ready_) {
    if (prep_ready_ && !ctx_.act_order && !ctx_.rtn) {
      trellis_prep_ = prep_;
    } else {
      trellis_prep_ = gptq_prepare(h_, n_, ctx_.damp, /*act_order=*/false);
    }
    trellis_prep_ready_ = true;
  }
  QuantizedWeight q =
      gptq_quantize_trellis(w.data(), static_cast<int>(rows), n_, trellis_prep_, st, ctx_.threads);
  if (rel_error != nullptr) *rel_error = relative_error(w.data(), q, h_, ctx_.threads);
  return q;
}

double UnitQuantizer::trellis_error(const std::vector<float>& w, const QuantSetting& st) {
  const int64_t rows = static_cast<int64_t>(w.size()) / n_;
  const int64_t tiles = rows / kTrellisTileDim, keep = kTrellisMeasureRows / kTrellisTileDim;
  double err = 0.0;
  if (rows <= kTrellisMeasureRows || rows % kTrellisTileDim != 0) {
    quantize_trellis(w, st, &err);
    return err;
  }
  std::vector<float> sub;
  sub.reserve(static_cast<size_t>(kTrellisMeasureRows) * n_);
  for (int64_t i = 0; i < keep; ++i) {  // tile rows i * tiles / keep: spread over the weight
    const auto first = w.begin() + (i * tiles / keep) * kTrellisTileDim * n_;
    sub.insert(sub.end(), first, first + kTrellisTileDim * n_);
  }
  quantize_trellis(sub, st, &err);
  return err;
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
  // Scalar settings (one width or a mix of two) go to the GPU in one call when there is one;
  // trellis settings are quantized one by one.
  std::vector<double> out(settings.size(), 0.0);
  std::vector<QuantSetting> gpu_settings;
  std::vector<size_t> gpu_at;
  for (size_t i = 0; i < settings.size(); ++i) {
    const QuantSetting& st = settings[i];
    if (st.trellis) {
      out[i] = trellis_error(w, st);
    } else if (on_gpu()) {
      gpu_settings.push_back(st);
      gpu_at.push_back(i);
    } else {
      out[i] = relative_error(w.data(), quantize_cpu(w, st), h_, ctx_.threads);
    }
  }
  if (!gpu_settings.empty()) {
    const std::vector<double> e = ctx_.gpu->errors(w.data(), rows, gpu_settings);
    for (size_t i = 0; i < gpu_at.size(); ++i) out[gpu_at[i]] = e[i];
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
  // The refit re-solves scalar codes' group scales (scale_refit.h); trellis layers keep theirs.
  const bool refit = refine_ && ctx_.scale_refit != 0 && !ctx_.rtn && !st.trellis;
  QuantizedWeight q;
  if (st.trellis) {
    q = quantize_trellis(w, st, rel_error);
  } else if (on_gpu()) {
    q = ctx_.gpu->quantize(w.data(), rows, st, rel_error);
  } else {
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
