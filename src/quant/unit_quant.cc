#include "quant/unit_quant.h"

#include <algorithm>
#include <chrono>

#include "backend/cpu/trellis.h"
#include "core/error.h"
#include "quant/gptq_device.h"
#include "quant/gptq_trellis.h"
#include "quant/hadamard.h"
#include "quant/linalg.h"
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

// Rotates (or unrotates) rows of n values in bands of rows on `threads` threads: each row is
// transformed alone, so the result is the single-threaded one (at the 8B shape a block's
// weights are 218M values, each rotated on the way in and its dequantized values back).
void rotate_rows(float* m, int64_t rows, int n, const HadamardRotation& rot, int threads,
                 bool unrotate) {
  parallel_ranges(rows, std::min<int64_t>(threads, rows / 64 + 1), [&](int64_t r0, int64_t r1) {
    if (unrotate) {
      hadamard_unrotate_rows(m + r0 * n, r1 - r0, n, rot);
    } else {
      hadamard_rotate_rows(m + r0 * n, r1 - r0, n, rot);
    }
  });
}

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
    ScopedSeconds target_timer(ctx_.timings ? &ctx_.timings->target : nullptr);
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

void UnitQuantizer::check_trellis(int64_t rows, const QuantSetting& st) const {
  GYRE_CHECK(rot_.active(), "trellis ", st.str(), ": the layer's unit is not rotated (trellis ",
             "layers need --hadamard and a width with a Hadamard block)");
  GYRE_CHECK(trellis_tileable(rows, n_), "trellis ", st.str(), ": a [", rows, ", ", n_,
             "] weight is not made of 16 x 16 tiles");
  GYRE_CHECK(st.group_size == rot_.block, "trellis ", st.str(), ": the group must be the ",
             "rotation's block ", rot_.block);
}

QuantizedWeight UnitQuantizer::quantize_trellis(const std::vector<float>& w, const QuantSetting& st,
                                                double* rel_error) {
  const int64_t rows = static_cast<int64_t>(w.size()) / n_;
  check_trellis(rows, st);
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

const std::vector<float>& UnitQuantizer::trellis_sample(const std::vector<float>& w,
                                                        std::vector<float>& sub) const {
  const int64_t rows = static_cast<int64_t>(w.size()) / n_;
  const int64_t tiles = rows / kTrellisTileDim, keep = kTrellisMeasureRows / kTrellisTileDim;
  if (rows <= kTrellisMeasureRows || rows % kTrellisTileDim != 0) return w;
  sub.clear();
  sub.reserve(static_cast<size_t>(kTrellisMeasureRows) * n_);
  for (int64_t i = 0; i < keep; ++i) {  // tile rows i * tiles / keep: spread over the weight
    const auto first = w.begin() + (i * tiles / keep) * kTrellisTileDim * n_;
    sub.insert(sub.end(), first, first + kTrellisTileDim * n_);
  }
  return sub;
}

const std::vector<float>& UnitQuantizer::in_rotated_space(const std::vector<float>& m,
                                                          std::vector<float>& rotated) const {
  if (!rot_.active()) return m;
  rotated = m;
  ScopedSeconds timer(ctx_.timings ? &ctx_.timings->rotate : nullptr);
  rotate_rows(rotated.data(), static_cast<int64_t>(m.size()) / n_, n_, rot_, ctx_.threads, false);
  return rotated;
}

std::vector<double> UnitQuantizer::errors(const std::vector<float>& w_in,
                                          const std::vector<QuantSetting>& settings) {
  GYRE_CHECK(n_ > 0 && w_in.size() % static_cast<size_t>(n_) == 0,
             "internal: weight width mismatch");
  ScopedSeconds timer(ctx_.timings ? &ctx_.timings->gptq : nullptr);
  // Trellis settings see only their sample: rotated alone (a row's rotation is its own), the
  // whole weight only when another setting needs it.
  std::vector<float> rotated;
  bool all_trellis = true;
  for (const QuantSetting& st : settings) all_trellis = all_trellis && st.trellis;
  const std::vector<float>& w = all_trellis ? w_in : in_rotated_space(w_in, rotated);
  const int rows = static_cast<int>(static_cast<int64_t>(w.size()) / n_);
  // Scalar settings (one width or a mix of two) go to the GPU in one call when there is one, and
  // so do the trellis settings (on their sample; stacked into one LDLQ sweep there); on the CPU,
  // trellis settings are quantized here.
  std::vector<double> out(settings.size(), 0.0);
  std::vector<QuantSetting> gpu_settings, gpu_trellis;
  std::vector<size_t> gpu_at, trellis_at;
  std::vector<float> sub, sub_rotated;
  const std::vector<float>* sample = nullptr;
  for (size_t i = 0; i < settings.size(); ++i) {
    const QuantSetting& st = settings[i];
    if (st.trellis) {
      if (sample == nullptr) sample = &in_rotated_space(trellis_sample(w_in, sub), sub_rotated);
      if (on_gpu()) {
        check_trellis(static_cast<int64_t>(sample->size()) / n_, st);
        gpu_trellis.push_back(st);
        trellis_at.push_back(i);
      } else {
        quantize_trellis(*sample, st, &out[i]);
      }
    } else if (on_gpu()) {
      gpu_settings.push_back(st);
      gpu_at.push_back(i);
    } else {
      out[i] = relative_error(w.data(), quantize_cpu(w, st), h_, ctx_.threads);
    }
  }
  if (!gpu_trellis.empty()) {
    const int sample_rows = static_cast<int>(static_cast<int64_t>(sample->size()) / n_);
    const std::vector<double> e = ctx_.gpu->errors(sample->data(), sample_rows, gpu_trellis);
    for (size_t i = 0; i < trellis_at.size(); ++i) out[trellis_at[i]] = e[i];
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
  const int rows = static_cast<int>(static_cast<int64_t>(w_in.size()) / n_);
  // A weight already on st's grid (a GGUF tensor at its own width and block) is stored as it is:
  // nothing is lost, where GPTQ's target correction would move it off the grid to make up for
  // upstream errors that, with the upstream layers stored exactly too, are not there. The
  // reported error is then the weight-space one, ||W - Q||^2 / ||W||^2 (the Hessian's needs the
  // host copy, and both are ~1e-8 here).
  if (ctx_.exact_grid && !st.trellis && !st.mixed() && !rot_.active() &&
      rtn_exact(w_in.data(), rows, n_, st)) {
    QuantizedWeight q = rtn_quantize(w_in.data(), rows, n_, st);
    if (rel_error != nullptr) {
      double e = 0.0, t = 0.0;
      for (size_t i = 0; i < w_in.size(); ++i) {
        e += (double{q.dequant[i]} - w_in[i]) * (double{q.dequant[i]} - w_in[i]);
        t += double{w_in[i]} * w_in[i];
      }
      *rel_error = t > 0.0 ? e / t : 0.0;
    }
    return q;
  }
  std::vector<float> rotated;
  const std::vector<float>& w_rot = in_rotated_space(w_in, rotated);
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
    ScopedSeconds timer(ctx_.timings ? &ctx_.timings->rotate : nullptr);
    rotate_rows(q.dequant.data(), rows, n_, rot_, ctx_.threads, true);
  }
  return q;
}

std::vector<float> UnitQuantizer::quantization_target(const std::vector<float>& w_in) {
  // (quantize() of one weight does the same without the copy of an unrotated, uncorrected w)
  std::vector<float> rotated;
  const std::vector<float>& w_rot = in_rotated_space(w_in, rotated);
  if (!corrected_) return rot_.active() ? std::move(rotated) : w_rot;
  const int rows = static_cast<int>(static_cast<int64_t>(w_rot.size()) / n_);
  return on_gpu() ? ctx_.gpu->corrected_target(w_rot.data(), rows)
                  : corrected_target(w_rot, n_, cross_, factor_, ctx_.threads);
}

std::vector<std::vector<double>> UnitQuantizer::errors_many(
    const std::vector<const std::vector<float>*>& ws, const std::vector<QuantSetting>& settings) {
  GYRE_CHECK(n_ > 0, "internal: unit without input");
  bool stack = on_gpu() && ws.size() > 1 && !settings.empty();
  for (const QuantSetting& st : settings)
    stack = stack && st.trellis && st.group_size == settings[0].group_size;
  // Each weight's sample (q's and k's are alike though the weights are not), rotated as
  // errors() of one weight measures it.
  std::vector<std::vector<float>> samples;
  for (size_t i = 0; i < ws.size() && stack; ++i) {
    GYRE_CHECK(ws[i]->size() % static_cast<size_t>(n_) == 0, "internal: weight width mismatch");
    std::vector<float> sub, sub_rotated;
    const std::vector<float>& s = in_rotated_space(trellis_sample(*ws[i], sub), sub_rotated);
    samples.push_back(s);
    stack = s.size() == samples[0].size();
  }
  std::vector<std::vector<double>> out;
  if (!stack) {
    for (const std::vector<float>* w : ws) out.push_back(errors(*w, settings));
    return out;
  }
  ScopedSeconds timer(ctx_.timings ? &ctx_.timings->gptq : nullptr);
  std::vector<const float*> ptrs;
  for (const std::vector<float>& s : samples) ptrs.push_back(s.data());
  const int64_t rows = static_cast<int64_t>(samples[0].size()) / n_;
  for (const QuantSetting& st : settings) check_trellis(rows, st);
  return ctx_.gpu->trellis_errors(ptrs, static_cast<int>(rows), settings);
}

std::vector<QuantizedWeight> UnitQuantizer::quantize_many(
    const std::vector<const std::vector<float>*>& ws, const std::vector<QuantSetting>& settings,
    std::vector<double>& rel_errors) {
  GYRE_CHECK(ws.size() == settings.size(), "internal: weights and settings differ in number");
  bool stack = on_gpu() && ws.size() > 1;
  for (size_t i = 0; i < ws.size(); ++i)
    stack = stack && settings[i].trellis && settings[i].group_size == settings[0].group_size &&
            ws[i]->size() == ws[0]->size();
  std::vector<QuantizedWeight> out;
  rel_errors.assign(ws.size(), 0.0);
  if (!stack) {
    for (size_t i = 0; i < ws.size(); ++i)
      out.push_back(quantize(*ws[i], settings[i], &rel_errors[i]));
    return out;
  }
  GYRE_CHECK(n_ > 0 && ws[0]->size() % static_cast<size_t>(n_) == 0,
             "internal: weight width mismatch");
  ScopedSeconds timer(ctx_.timings ? &ctx_.timings->gptq : nullptr);
  std::vector<std::vector<float>> targets;
  std::vector<const float*> ptrs;
  for (const std::vector<float>* w : ws) targets.push_back(quantization_target(*w));
  for (const std::vector<float>& t : targets) ptrs.push_back(t.data());
  const int64_t rows = static_cast<int64_t>(targets[0].size()) / n_;
  for (const QuantSetting& st : settings) check_trellis(rows, st);
  out = ctx_.gpu->quantize_trellis(ptrs, static_cast<int>(rows), settings, &rel_errors);
  ScopedSeconds rotating(ctx_.timings ? &ctx_.timings->rotate : nullptr);
  for (QuantizedWeight& q : out) {  // as quantize(): the layer's floats are unrotated
    q.had = rot_;
    rotate_rows(q.dequant.data(), rows, n_, rot_, ctx_.threads, true);
  }
  return out;
}

}  // namespace gyre::quant
