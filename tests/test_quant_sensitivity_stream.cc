// The block-major sensitivity pass (quant/sensitivity.cc: each block loaded once, every unit's
// perturbed hidden states carried through it) against the straightforward recomputation it
// replaced: per unit, a fresh forward of the whole model from that unit's block on, with only
// that unit quantized at the probe, through the host-side BlockRunner path, then the final norm,
// the head and the KL. On the CPU both must give the same numbers (same arithmetic per unit),
// whether the carried states stay on the backend or wait on the host (stream budget 0). The
// model is a tiny synthetic one with GPTQ (not RTN) probes, so the probe's own path is covered.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/half.h"
#include "core/mapped_file.h"
#include "quant/gptq_device.h"
#include "quant/sensitivity.h"
#include "quant/synthetic.h"
#include "quant/unit_quant.h"
#ifdef GYRE_HAVE_CUDA
#include "quant/cuda/kl_cuda.h"
#endif

namespace gyre::quant {
namespace {

ModelConfig tiny_shape() {
  ModelConfig c;
  c.arch = "llama";
  c.model_type = "synthetic-tiny";
  c.vocab_size = 97, c.dim = 64, c.hidden_dim = 96, c.n_layers = 3;
  c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 16, c.max_seq_len = 64;
  c.norm_eps = 1e-5f;
  c.rope.theta = 10000.0f;
  c.rope.rot_dim = c.head_dim;
  c.tie_embeddings = false;
  return c;
}

// The pass as it was: the reference hidden states of every block kept, and per unit the blocks
// from its own on run again (host path, one upload per use), the unit quantized in the hook.
std::map<std::string, UnitSensitivity> recompute(const QuantContext& ctx, const QuantSetting& probe,
                                                 const std::vector<float>& norm,
                                                 const std::vector<float>& head) {
  const ModelConfig& c = ctx.model->config;
  const int rows = static_cast<int>(ctx.rows.size()), length = static_cast<int>(ctx.rows[0].size());
  const int64_t vocab = static_cast<int64_t>(head.size()) / c.dim;
  BlockRunner runner(*ctx.backend, c, rows, length);
  std::vector<BlockWeights> blocks;
  for (int b = 0; b < c.n_layers; ++b) blocks.push_back(block_of(ctx, b));
  std::vector<std::vector<float>> inputs{embed_rows(ctx)};
  for (int b = 0; b < c.n_layers; ++b) {
    std::vector<float> h = inputs.back();
    runner.run(h, blocks[b], nullptr);
    inputs.push_back(std::move(h));
  }
  const std::vector<float> ref = runner.logits(runner.final_norm(inputs.back(), norm), head, vocab);
  std::map<std::string, UnitSensitivity> out;
  for (int b = 0; b < c.n_layers; ++b)
    for (int u = 0; u < kUnits; ++u) {
      const Unit unit = static_cast<Unit>(u);
      UnitSensitivity s;
      BlockWeights w = blocks[b];
      std::vector<float> h = inputs[b];
      runner.run(h, w, [&](Unit at, const std::vector<float>& x, int64_t tokens, BlockWeights& bw) {
        if (at != unit) return;
        UnitQuantizer uq(ctx);
        uq.set_input(x, tokens);
        for (const std::string& name : unit_linears(unit)) {
          double err = 0;
          bw.t[name] = uq.quantize(bw.t[name], probe, &err).dequant;
          s.probe_error += err;
        }
      });
      for (int later = b + 1; later < c.n_layers; ++later) runner.run(h, blocks[later], nullptr);
      s.kl = mean_kl_of_logits(ref, runner.logits(runner.final_norm(h, norm), head, vocab), vocab,
                               ctx.threads);
      out[layer_tensor(b, unit_linears(unit)[0].c_str())] = s;
    }
  return out;
}

// A tiny synthetic model with a random final norm and head (F32 views of `norm` and `head`).
struct TinyModel {
  ModelConfig c = tiny_shape();
  LoadedModel lm;
  std::vector<float> norm, head;
  QuantContext ctx;
  std::unique_ptr<Backend> backend;
  explicit TinyModel(const std::string& device);
};

TinyModel::TinyModel(const std::string& device) {
  lm.path = "synthetic:tiny";
  lm.config = c;
  // A random final norm and head (values like synthetic.cc's), as F32 views.
  norm.resize(static_cast<size_t>(c.dim));
  head.resize(static_cast<size_t>(c.vocab_size) * c.dim);
  uint32_t state = 12345;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / static_cast<float>(1u << 24) * 2.0f - 1.0f;
  };
  for (float& v : norm) v = 1.0f + 0.2f * next();
  for (float& v : head) v = 0.4f * next();
  auto view = [](const char* name, std::vector<float>& v, std::vector<int64_t> shape) {
    TensorView t;
    t.name = name;
    t.dtype = DType::F32;
    t.shape = std::move(shape);
    t.data = v.data();
    t.nbytes = v.size() * sizeof(float);
    return t;
  };
  lm.weights.add(view("model.norm.weight", norm, {c.dim}));
  lm.weights.add(view("lm_head.weight", head, {c.vocab_size, c.dim}));
  backend = backend_create(device, 2);
  ctx.model = &lm;
  ctx.backend = backend.get();
  ctx.threads = 2;
  ctx.progress = false;
  ctx.clip_search = true;
  ctx.blocks = [&](int layer) { return synthetic_block(c, layer, 1); };
  ctx.embed = [&](const std::vector<std::vector<int>>& rows) {
    std::vector<float> out;
    for (const auto& row : rows)
      for (int id : row)
        for (int k = 0; k < c.dim; ++k) out.push_back(std::sin(0.37f * id + 1.3f * k));
    return out;
  };
  for (int r = 0; r < 3; ++r) {
    std::vector<int> row;
    for (int i = 0; i < 12; ++i) row.push_back((r * 31 + i * 17) % c.vocab_size);
    ctx.rows.push_back(row);
  }
}

TEST(QuantSensitivityStream, BlockMajorPassEqualsPerUnitRecomputation) {
  TinyModel t("cpu");
  const ModelConfig& c = t.c;
  const QuantContext& ctx = t.ctx;
  const std::vector<float>&norm = t.norm, &head = t.head;
  const QuantSetting probe{3, 32, true};
  const auto want = recompute(ctx, probe, norm, head);
  ASSERT_EQ(want.size(), static_cast<size_t>(c.n_layers * kUnits));
  for (size_t budget : {kSensitivityStreamBudget, size_t{0}}) {
    SCOPED_TRACE("stream budget " + std::to_string(budget));
    const auto got = measure_sensitivity(ctx, probe, 8, budget);
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [key, w] : want) {
      ASSERT_TRUE(got.count(key)) << key;
      const UnitSensitivity& g = got.at(key);
      EXPECT_GT(w.kl, 1e-6) << key;  // the probe is visible at the output
      EXPECT_NEAR(g.kl, w.kl, 1e-12 * w.kl) << key;
      EXPECT_NEAR(g.probe_error, w.probe_error, 1e-12 * w.probe_error) << key;
    }
  }
  // Fewer rows than asked for: the pass uses the first max_rows rows only.
  QuantContext two = ctx;
  two.rows.resize(2);
  const auto want2 = recompute(two, probe, norm, head);
  const auto got2 = measure_sensitivity(ctx, probe, 2);
  for (const auto& [key, w] : want2) EXPECT_NEAR(got2.at(key).kl, w.kl, 1e-12 * w.kl) << key;
}

// `convert --synthetic` with the default chooser: the sensitivity pass runs on the synthetic
// model (its random head, even with --head-bits 0), its results land in measurement.json and the
// per-phase summary, and the weighted choice keeps the bit budget.
TEST(QuantSensitivityStream, SyntheticConversionRunsTheKlChooser) {
  ModelConfig c = tiny_shape();
  c.n_layers = 2;
  ConvertOptions o;
  o.out = ::testing::TempDir() + "/gyre_synthetic_kl";
  std::filesystem::remove_all(o.out);
  o.rows = 2;
  o.length = 16;
  o.threads = 2;
  o.device = "cpu";
  o.head_bits = 0;
  o.progress = false;
  ASSERT_EQ(o.chooser, "kl");  // the default
  ::testing::internal::CaptureStderr();
  convert_synthetic(c, "tiny", o);
  ::testing::internal::GetCapturedStderr();
  const auto summary = nlohmann::json::parse(read_text_file(o.out + "/conversion.json"));
  const auto meas = nlohmann::json::parse(read_text_file(o.out + "/measurement.json"));
  EXPECT_EQ(summary.at("chooser").get<std::string>(), "kl");
  EXPECT_GT(summary.at("seconds").at("sensitivity").get<double>(), 0.0);
  EXPECT_GT(summary.at("peak_host_rss_bytes").get<double>(), 0.0);
  EXPECT_LE(summary.at("bits_per_weight").get<double>(), 4.0);
  ASSERT_TRUE(meas.contains("sensitivity"));
  EXPECT_EQ(meas.at("sensitivity").size(), static_cast<size_t>(c.n_layers * kUnits));
  for (const auto& [name, u] : meas.at("sensitivity").items()) {
    EXPECT_GT(u.at("kl").get<double>(), 0.0) << name;
    EXPECT_GT(u.at("probe_error").get<double>(), 0.0) << name;
  }
  std::filesystem::remove_all(o.out);
}

#ifdef GYRE_HAVE_CUDA
// The GPU KL reduction against the host's on the same FP16 logits (rows of a large vocabulary,
// one far from uniform), and the whole pass on the CUDA backend against the CPU's (FP16
// activations: close, not equal).
TEST(QuantSensitivityCuda, GpuKlMatchesHostAndPassMatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  auto be = backend_create("cuda", 2);
  const int64_t rows = 5, vocab = 128256;
  std::vector<float> a(static_cast<size_t>(rows * vocab)), b(a.size());
  uint32_t state = 99;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / static_cast<float>(1u << 24) * 2.0f - 1.0f;
  };
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = f16_to_f32(f32_to_f16(6.0f * next() + (i % 977 == 0 ? 12.0f : 0.0f)));
    b[i] = f16_to_f32(f32_to_f16(a[i] + 0.3f * next()));
  }
  auto upload = [&](std::vector<float>& v) {
    TensorView t;
    t.name = "logits";
    t.dtype = DType::F32;
    t.shape = {rows, vocab};
    t.data = v.data();
    t.nbytes = v.size() * sizeof(float);
    return be->upload_weight(t);
  };
  const Tensor da = upload(a), db = upload(b);
  ASSERT_EQ(da.dtype, DType::F16);
  const double want = mean_kl_of_logits(a, b, vocab, 2);
  EXPECT_GT(want, 1e-3);
  EXPECT_NEAR(cuda::mean_kl_f16(da.data, db.data, rows, vocab), want, 1e-9 * want);
  EXPECT_NEAR(cuda::mean_kl_f16(da.data, da.data, rows, vocab), 0.0, 1e-12);

  // Round-to-nearest probes, so both devices perturb by the same weights and only the FP16
  // activations differ (with GPTQ the slightly different Hessians flip some roundings, which moves
  // a unit's KL by more than the FP16 noise).
  TinyModel cpu("cpu"), gpu("cuda");
  cpu.ctx.rtn = gpu.ctx.rtn = true;
  const QuantSetting probe{3, 32, true};
  const auto want_s = measure_sensitivity(cpu.ctx, probe, 8);
  for (size_t budget : {kSensitivityStreamBudget, size_t{0}}) {
    const auto got = measure_sensitivity(gpu.ctx, probe, 8, budget);
    ASSERT_EQ(got.size(), want_s.size());
    for (const auto& [key, w] : want_s) {
      EXPECT_NEAR(got.at(key).kl, w.kl, 0.1 * w.kl + 1e-5) << key;
      EXPECT_NEAR(got.at(key).probe_error, w.probe_error, 0.05 * w.probe_error) << key;
    }
  }
}

// GPTQ probes on the GPU: the pass runs the units of a block at once, units 1.. on quantizers of
// their own (GptqDevice::another) on other host threads; the numbers must be those of the
// sequential per-unit recomputation on the one quantizer (the CPU backend's forwards, so only the
// quantizers differ; their float64 sums may differ in order).
TEST(QuantSensitivityCuda, ParallelGpuProbesEqualSequentialOnes) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  TinyModel t("cpu");
  const std::unique_ptr<GptqDevice> gpu = make_gptq_device("cuda");
  t.ctx.gpu = gpu.get();
  const QuantSetting probe{3, 32, true};
  const auto want = recompute(t.ctx, probe, t.norm, t.head);
  const auto got = measure_sensitivity(t.ctx, probe, 8);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [key, w] : want) {
    ASSERT_TRUE(got.count(key)) << key;
    EXPECT_GT(w.kl, 1e-6) << key;
    EXPECT_NEAR(got.at(key).kl, w.kl, 1e-9 * w.kl) << key;
    EXPECT_NEAR(got.at(key).probe_error, w.probe_error, 1e-9 * w.probe_error) << key;
  }
}

// The measurement with trellis candidates on the GPU measures a block's units at once (units 1..
// on quantizers of their own, host threads, the forward going on meanwhile); the same numbers as
// one unit at a time (QuantContext::parallel_units false), in the same order.
TEST(QuantSensitivityCuda, ParallelTrellisMeasurementEqualsSequential) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  TinyModel t("cuda");
  const std::unique_ptr<GptqDevice> gpu = make_gptq_device("cuda");
  t.ctx.gpu = gpu.get();
  t.ctx.hadamard = t.ctx.trellis = true;
  Measurement seq, par;
  t.ctx.parallel_units = false;
  measure(t.ctx, seq, [](const Measurement&) {});
  t.ctx.parallel_units = true;
  measure(t.ctx, par, [](const Measurement&) {});
  ASSERT_EQ(par.layers.size(), seq.layers.size());
  ASSERT_EQ(seq.layers.size(), static_cast<size_t>(t.c.n_layers) * 7);
  int trellis = 0;
  for (size_t i = 0; i < seq.layers.size(); ++i) {
    const LayerErrors &a = seq.layers[i], &b = par.layers[i];
    ASSERT_EQ(a.name, b.name);
    EXPECT_EQ(a.rows, b.rows);
    EXPECT_EQ(a.cols, b.cols);
    ASSERT_EQ(a.errors.size(), b.errors.size()) << a.name;
    for (size_t k = 0; k < a.errors.size(); ++k) {
      EXPECT_EQ(a.errors[k].first.bits, b.errors[k].first.bits);
      EXPECT_EQ(a.errors[k].first.trellis, b.errors[k].first.trellis);
      trellis += a.errors[k].first.trellis ? 1 : 0;
      EXPECT_GT(a.errors[k].second, 0.0) << a.name;
      EXPECT_NEAR(b.errors[k].second, a.errors[k].second, 1e-9 * a.errors[k].second) << a.name;
    }
  }
  EXPECT_GT(trellis, 0);  // the trellis path ran
}
#endif

}  // namespace
}  // namespace gyre::quant
