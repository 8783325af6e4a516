// The sensitivity pass (quant/sensitivity.h) against an independent oracle: the engine's
// Transformer (another forward-pass implementation) run on a copy of stories260K whose one unit
// is replaced by its round-to-nearest quantization, with the KL computed naively in float64.
// And the weighted choice against brute force on a case where weighting changes the answer.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "engine/transformer.h"
#include "model/loader.h"
#include "quant/convert_pass.h"
#include "quant/gptq.h"
#include "quant/optimizer.h"
#include "quant/sensitivity.h"

namespace gyre::quant {
namespace {

const std::string kModel = std::string(GYRE_FIXTURES) + "/stories260K";

// Naive float64 KL(p || q) of two logit rows.
double naive_kl(const float* a, const float* b, int n) {
  double ma = -INFINITY, mb = -INFINITY;
  for (int i = 0; i < n; ++i) ma = std::max(ma, double{a[i]}), mb = std::max(mb, double{b[i]});
  double sa = 0, sb = 0;
  for (int i = 0; i < n; ++i) sa += std::exp(a[i] - ma), sb += std::exp(b[i] - mb);
  double kl = 0;
  for (int i = 0; i < n; ++i) {
    const double la = a[i] - ma - std::log(sa), lb = b[i] - mb - std::log(sb);
    kl += std::exp(la) * (la - lb);
  }
  return kl;
}

TEST(QuantSensitivity, UnitKlMatchesTransformerOracle) {
  auto model = load_model(kModel);
  const ModelConfig& c = model->config;
  auto backend = backend_create("cpu", 2);
  QuantContext ctx;
  ctx.model = model.get();
  ctx.backend = backend.get();
  ctx.rtn = true;  // deterministic from the weights alone, so the oracle can redo it
  ctx.progress = false;
  ctx.threads = 2;
  ctx.rows = {{1, 403, 407, 261, 378, 293, 266, 360, 300, 412, 301, 313},
              {1, 67, 420, 288, 302, 380, 285, 331, 304, 260, 427, 295}};
  const QuantSetting probe{3, 128, true};  // narrowed to g64 on stories260K's 64-wide layers
  const auto sens = measure_sensitivity(ctx, probe, 8);
  // Every unit whose width the probe's group divides (stories260K's down_proj is 172 wide).
  EXPECT_EQ(sens.size(), static_cast<size_t>(c.n_layers * 3));
  const int vocab = c.vocab_size, len = static_cast<int>(ctx.rows[0].size());
  auto logits_of = [&](const WeightSet& w) {
    Transformer t(c, w, *backend, len);
    std::vector<float> out;
    for (const auto& row : ctx.rows) {
      std::vector<int32_t> ids(row.begin(), row.end());
      std::vector<float> l(static_cast<size_t>(len) * vocab);
      t.forward(ids.data(), len, 0, l.data(), true);
      out.insert(out.end(), l.begin(), l.end());
    }
    return out;
  };
  const std::vector<float> ref = logits_of(model->weights);
  for (int b : {0, c.n_layers - 1})
    for (Unit u : {Unit::QKV, Unit::O, Unit::GateUp}) {
      WeightSet w;
      std::vector<std::vector<float>> keep;
      for (const auto& [name, t] : model->weights.all()) {
        bool replaced = false;
        for (const std::string& s : unit_linears(u))
          if (name == layer_tensor(b, (s + ".weight").c_str())) {
            const std::vector<float> f = tensor_to_f32(t);
            keep.push_back(rtn_quantize(f.data(), static_cast<int>(t.rows()),
                                        static_cast<int>(t.cols()), QuantSetting{3, 64, true})
                               .dequant);
            TensorView v = t;
            v.dtype = DType::F32;
            v.data = keep.back().data();
            v.nbytes = keep.back().size() * sizeof(float);
            w.add(v);
            replaced = true;
          }
        if (!replaced) w.add(t);
      }
      const std::vector<float> got = logits_of(w);
      double kl = 0;
      const int n = static_cast<int>(ref.size() / vocab);
      for (int i = 0; i < n; ++i)
        kl += naive_kl(ref.data() + int64_t{i} * vocab, got.data() + int64_t{i} * vocab, vocab);
      kl /= n;
      const std::string key = layer_tensor(b, unit_linears(u)[0].c_str());
      ASSERT_TRUE(sens.count(key)) << key;
      EXPECT_GT(kl, 1e-5) << key;  // the probe must be visible at the output
      EXPECT_NEAR(sens.at(key).kl, kl, 1e-3 * kl + 1e-7) << key;
      EXPECT_GT(sens.at(key).probe_error, 0.0) << key;
    }
}

TEST(QuantSensitivity, MeanKlOfLogitsMatchesNaive) {
  std::vector<float> a = {1.0f, 2.0f, -3.0f, 0.5f, 0.0f, 0.0f, 0.0f, 0.0f};
  std::vector<float> b = {1.5f, 1.0f, -2.0f, 0.5f, 3.0f, -1.0f, 0.0f, 2.0f};
  const double want =
      (naive_kl(a.data(), b.data(), 4) + naive_kl(a.data() + 4, b.data() + 4, 4)) / 2;
  EXPECT_NEAR(mean_kl_of_logits(a, b, 4), want, 1e-12);
  EXPECT_EQ(mean_kl_of_logits(a, a, 4), 0.0);
}

// optimized_plan with sensitivities on stories260K's shapes (15 units: down_proj fits no group)
// against brute force over every combination of two settings per unit: the plan must reach the
// least weighted error sum(sensitivity * relative error) within the budget. Random errors and
// sensitivities; one instance where the weighting changes the plan.
TEST(QuantSensitivity, WeightedPlanMatchesBruteForce) {
  auto model = load_model(kModel);
  const ModelConfig& c = model->config;
  const QuantSetting lo{2, 32, true}, hi{4, 32, true};
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> uni(0.01, 1.0);
  for (int trial = 0; trial < 3; ++trial) {
    Measurement meas;
    std::vector<std::string> unit_first;
    std::vector<double> unit_numel, unit_err_lo, unit_err_hi, unit_sens;
    for (int b = 0; b < c.n_layers; ++b)
      for (Unit u : {Unit::QKV, Unit::O, Unit::GateUp}) {
        double numel = 0, elo = 0, ehi = 0;
        for (const std::string& s : unit_linears(u)) {
          const TensorView& t = model->weights.get(layer_tensor(b, (s + ".weight").c_str()));
          LayerErrors le;
          le.name = layer_tensor(b, s.c_str());
          le.rows = t.rows();
          le.cols = t.cols();
          const double e_lo = uni(rng), e_hi = e_lo * uni(rng) * 0.5;
          le.errors = {{lo, e_lo}, {hi, e_hi}};
          meas.layers.push_back(le);
          numel += static_cast<double>(t.numel());
          elo += e_lo;
          ehi += e_hi;
        }
        unit_first.push_back(layer_tensor(b, unit_linears(u)[0].c_str()));
        unit_numel.push_back(numel);
        unit_err_lo.push_back(elo);
        unit_err_hi.push_back(ehi);
        unit_sens.push_back(std::exp(4.0 * uni(rng)));
        meas.sensitivity[unit_first.back()] = {unit_sens.back() * 0.5, 0.5};
      }
    meas.blocks_done = c.n_layers;
    const size_t n = unit_first.size();
    double total = 0;
    for (double x : unit_numel) total += x;
    const double bpw = 3.0 + 0.4 * trial;
    auto objective = [&](auto upgraded, bool weighted) {
      double e = 0;
      for (size_t u = 0; u < n; ++u)
        e += (weighted ? unit_sens[u] : 1.0) * (upgraded(u) ? unit_err_hi[u] : unit_err_lo[u]);
      return e;
    };
    std::vector<int> best_of(2);
    for (bool weighted : {false, true}) {
      double best = INFINITY;
      int best_mask = -1;
      for (int mask = 0; mask < (1 << n); ++mask) {
        double bits = 0;
        for (size_t u = 0; u < n; ++u)
          bits += unit_numel[u] * ((mask >> u) & 1 ? hi : lo).bits_per_weight();
        if (bits > bpw * total) continue;
        const double e = objective([&](size_t u) { return (mask >> u) & 1; }, weighted);
        if (e < best) best = e, best_mask = mask;
      }
      best_of[weighted] = best_mask;
      const Plan plan = optimized_plan(*model, meas, bpw, weighted);
      const double got = objective(
          [&](size_t u) { return plan.at(unit_first[u].substr(0, unit_first[u].size())) == hi; },
          weighted);
      EXPECT_NEAR(got, best, 1e-9 * best) << "trial " << trial << " weighted " << weighted;
      for (size_t u = 0; u < n; ++u)  // a unit's layers share its setting
        for (const std::string& s : unit_linears(u % 3 == 0   ? Unit::QKV
                                                 : u % 3 == 1 ? Unit::O
                                                              : Unit::GateUp))
          EXPECT_EQ(plan.at(layer_tensor(static_cast<int>(u / 3), s.c_str())),
                    plan.at(unit_first[u]));
    }
    if (trial == 0) {
      EXPECT_NE(best_of[0], best_of[1]);  // the weighting matters here
    }
  }
}

}  // namespace
}  // namespace gyre::quant
