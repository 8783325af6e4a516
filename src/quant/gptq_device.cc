#include "quant/gptq_device.h"

#include "backend/backend.h"
#include "backend/cpu/trellis.h"
#include "core/error.h"
#include "core/half.h"
#ifdef GYRE_HAVE_CUDA
#include "quant/cuda/gptq_engine.h"
#include "quant/gptq_trellis.h"
#endif

namespace gyre::quant {

#ifdef GYRE_HAVE_CUDA
namespace {

// A mix's wide groups are chosen from the device Hessian's diagonal exactly as gptq_quantize
// chooses them from GptqPrep::hdiag (the same values up to summation order).
cuda::Setting device_setting(const QuantSetting& st, int64_t cols,
                             const std::vector<double>& hdiag) {
  quant_setting_validate(st, cols, "quantize");
  return {st.bits, st.group_size, st.sym ? 1 : 0, st.mix_bits,
          mix_hi_groups(st, hdiag.data(), cols)};
}

class CudaGptq final : public GptqDevice {
 public:
  explicit CudaGptq(int ordinal) : engine_(ordinal), ordinal_(ordinal) {}
  std::unique_ptr<GptqDevice> another() const override {
    return std::make_unique<CudaGptq>(ordinal_);
  }
  void set_input(const float* x, int64_t tokens, int n, double damp, bool act_order,
                 bool clip_search) override {
    engine_.make_current();
    engine_.set_input(x, tokens, n, damp, act_order, clip_search);
    n_ = n;
  }
  std::vector<double> hessian() const override {
    engine_.make_current();
    return engine_.hessian();
  }
  double damp_used() const override { return engine_.damp_used(); }

  double set_target(const float* x_fp, const float* x_q, int64_t tokens,
                    double target_damp) override {
    engine_.make_current();
    return engine_.set_target(x_fp, x_q, tokens, target_damp);
  }
  std::vector<double> cross_covariance() const override { return engine_.cross(); }
  std::vector<float> corrected_target(const float* w, int rows) override {
    engine_.make_current();
    std::vector<float> out(static_cast<size_t>(rows) * n_);
    engine_.corrected_target(w, rows, out.data());
    return out;
  }

  std::vector<double> errors(const float* w, int rows,
                             const std::vector<QuantSetting>& settings) override {
    engine_.make_current();
    // Scalar settings run stacked at once, and so do trellis ones of one group (each of those
    // a vector quantizer per 16 columns, its own LDLQ sweep stacked with the others').
    std::vector<cuda::Setting> ds;
    for (const QuantSetting& st : settings)
      if (!st.trellis) ds.push_back(device_setting(st, n_, engine_.hessian_diagonal()));
    const double den = engine_.set_weight(w, rows);
    const std::vector<double> scalar = ds.empty() ? std::vector<double>{} : engine_.run(ds, false);
    std::vector<double> out(settings.size(), 0.0);
    std::vector<bool> done(settings.size(), false);
    size_t next_scalar = 0;
    for (size_t i = 0; i < settings.size(); ++i) {
      if (settings[i].trellis) {
        if (done[i]) continue;
        std::vector<int> ks;
        std::vector<size_t> at;
        for (size_t j = i; j < settings.size(); ++j)
          if (settings[j].trellis && settings[j].group_size == settings[i].group_size) {
            check_trellis(rows, settings[j]);
            ks.push_back(settings[j].bits);
            at.push_back(j);
            done[j] = true;
          }
        const std::vector<double> e =
            engine_.trellis_errors(ks, settings[i].group_size, kTrellisScaleFit);
        for (size_t c = 0; c < at.size(); ++c) out[at[c]] = den > 0.0 ? e[c] / den : 0.0;
      } else {
        out[i] = den > 0.0 ? scalar[next_scalar++] / den : 0.0;
      }
    }
    return out;
  }

  std::vector<std::vector<double>> trellis_errors(
      const std::vector<const float*>& ws, int rows,
      const std::vector<QuantSetting>& settings) override {
    engine_.make_current();
    GYRE_CHECK(!ws.empty() && !settings.empty(), "internal: empty trellis stack");
    std::vector<int> ks, of;
    for (size_t i = 0; i < ws.size(); ++i)
      for (const QuantSetting& st : settings) {
        check_trellis(rows, st);
        GYRE_CHECK(st.trellis && st.group_size == settings[0].group_size,
                   "internal: a trellis stack has trellis settings of one group");
        ks.push_back(st.bits);
        of.push_back(static_cast<int>(i));
      }
    const std::vector<double> den =
        engine_.set_weights(ws.data(), static_cast<int>(ws.size()), rows);
    const std::vector<double> e =
        engine_.trellis_stack(ks, of, settings[0].group_size, kTrellisScaleFit, false);
    std::vector<std::vector<double>> out(ws.size());
    for (size_t c = 0; c < e.size(); ++c)
      out[of[c]].push_back(den[of[c]] > 0.0 ? e[c] / den[of[c]] : 0.0);
    return out;
  }

  std::vector<QuantizedWeight> quantize_trellis(const std::vector<const float*>& ws, int rows,
                                                const std::vector<QuantSetting>& settings,
                                                std::vector<double>* rel_errors) override {
    engine_.make_current();
    GYRE_CHECK(!ws.empty() && ws.size() == settings.size(), "internal: trellis stack sizes differ");
    std::vector<int> ks, of;
    for (size_t i = 0; i < ws.size(); ++i) {
      check_trellis(rows, settings[i]);
      GYRE_CHECK(settings[i].trellis && settings[i].group_size == settings[0].group_size,
                 "internal: a trellis stack has trellis settings of one group");
      ks.push_back(settings[i].bits);
      of.push_back(static_cast<int>(i));
    }
    const std::vector<double> den =
        engine_.set_weights(ws.data(), static_cast<int>(ws.size()), rows);
    const std::vector<double> e =
        engine_.trellis_stack(ks, of, settings[0].group_size, kTrellisScaleFit, true);
    std::vector<QuantizedWeight> out;
    if (rel_errors != nullptr) rel_errors->clear();
    for (size_t i = 0; i < ws.size(); ++i) {
      if (rel_errors != nullptr) rel_errors->push_back(den[i] > 0.0 ? e[i] / den[i] : 0.0);
      QuantizedWeight q = shell(rows, settings[i]);
      std::vector<float> scales(q.scales.size());
      q.trellis.resize(q.dequant.size() / 256 *
                       static_cast<size_t>(trellis_tile_words(settings[i].bits)));
      engine_.fetch_trellis_of(static_cast<int>(i), q.dequant.data(), scales.data(),
                               q.trellis.data());
      to_f16(scales, q.scales);
      out.push_back(std::move(q));
    }
    return out;
  }

  QuantizedWeight quantize(const float* w, int rows, const QuantSetting& st,
                           double* rel_error) override {
    engine_.make_current();
    if (st.trellis) return quantize_one_trellis(w, rows, st, rel_error);
    const double den = engine_.set_weight(w, rows);
    cuda::Setting ds = device_setting(st, n_, engine_.hessian_diagonal());
    const double num = engine_.run({ds}, true)[0];
    if (rel_error != nullptr) *rel_error = den > 0.0 ? num / den : 0.0;
    QuantizedWeight out = shell(rows, st);
    out.hi_groups = std::move(ds.hi_groups);
    std::vector<uint8_t> q(out.dequant.size());
    std::vector<float> scales(out.scales.size()), mins(out.scales.size());
    engine_.fetch(out.dequant.data(), q.data(), scales.data(), mins.data());
    out.q.assign(q.begin(), q.end());
    to_f16(scales, out.scales);
    if (!st.sym) to_f16(mins, out.mins);
    return out;
  }

 private:
  // A result of `rows` rows with its dequant and (f16) scales sized, nothing filled.
  QuantizedWeight shell(int rows, const QuantSetting& st) const {
    QuantizedWeight out;
    out.setting = st;
    out.rows = rows;
    out.cols = n_;
    out.dequant.resize(static_cast<size_t>(rows) * n_);
    out.scales.resize(static_cast<size_t>(rows) * (n_ / st.group_size));
    return out;
  }
  static void to_f16(const std::vector<float>& v, std::vector<uint16_t>& out) {
    out.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_f16(v[i]);
  }

  void check_trellis(int rows, const QuantSetting& st) const {
    GYRE_CHECK(st.sym && !st.mixed() && rows % 16 == 0 && n_ % 16 == 0,
               "quantize: a trellis setting is symmetric, of one width, on 16 x 16 tiles");
  }
  // tr(E H E^T) of the trellis LDLQ of the weight set last.
  double trellis_run(int rows, const QuantSetting& st) {
    check_trellis(rows, st);
    return engine_.trellis(st.bits, st.group_size, kTrellisScaleFit);
  }

  QuantizedWeight quantize_one_trellis(const float* w, int rows, const QuantSetting& st,
                                       double* rel_error) {
    const double den = engine_.set_weight(w, rows);
    const double num = trellis_run(rows, st);
    if (rel_error != nullptr) *rel_error = den > 0.0 ? num / den : 0.0;
    QuantizedWeight out = shell(rows, st);
    std::vector<float> scales(out.scales.size());
    out.trellis.resize(out.dequant.size() / 256 * static_cast<size_t>(trellis_tile_words(st.bits)));
    engine_.fetch_trellis(out.dequant.data(), scales.data(), out.trellis.data());
    to_f16(scales, out.scales);
    return out;
  }

  cuda::Engine engine_;
  int ordinal_ = 0;
  int n_ = 0;
};

}  // namespace
#endif

std::unique_ptr<GptqDevice> make_gptq_device(const std::string& device) {
  GYRE_CHECK(device == "cuda" || device.rfind("cuda:", 0) == 0, "unknown quantizer device '",
             device, "' (expected cpu, cuda or cuda:N)");
#ifdef GYRE_HAVE_CUDA
  int index = 0;
  if (device.size() > 5) {
    size_t used = 0;
    try {
      index = std::stoi(device.substr(5), &used);
    } catch (const std::logic_error&) {
      used = 0;
    }
    GYRE_CHECK(used > 0 && used == device.size() - 5, "bad device '", device,
               "' (expected cuda:N)");
  }
  const int count = cuda::device_count();
  GYRE_CHECK(index >= 0 && index < count, "device '", device, "' is not present (", count,
             " CUDA devices found)");
  return std::make_unique<CudaGptq>(index);
#else
  fail("this Gyre was built without CUDA; use --device cpu");
#endif
}

std::string default_quant_device() {
  return cuda_available() ? "cuda" : "cpu";
}

}  // namespace gyre::quant
