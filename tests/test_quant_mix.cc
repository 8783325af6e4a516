// Mixes of two bit widths in one layer (model/gyre_qformat.h, backend/cpu/qmixed.h) against
// references written here: the stored integers and f16 scales decoded from the file's bytes by a
// bit reader of this file and evaluated in float64 (the layer's floats and its matmul), a tiny
// converted Llama against its float twin built from the same decoding, the bits accounting
// against a count by hand, and the optimizer choosing a mix when it is better per bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/qmixed.h"
#include "core/error.h"
#include "core/half.h"
#include "core/mapped_file.h"
#include "engine/transformer.h"
#include "model/gyre_quant_loader.h"
#include "model/loader.h"
#include "model/safetensors.h"
#include "model_test_util.h"
#include "quant/convert.h"
#include "quant/convert_pass.h"
#include "quant/gptq.h"
#include "quant/measure.h"
#include "quant/synthetic.h"
#include "quant_file_test_util.h"

namespace gyre::quant {
namespace {

namespace fs = std::filesystem;

std::vector<float> random_matrix(int rows, int cols, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> m(static_cast<size_t>(rows) * cols);
  for (float& x : m) x = d(rng);
  return m;
}

// H = 2/N X^T X of inputs whose columns have very different scales (so some groups carry far
// more input energy than others, as real activations do).
std::vector<double> uneven_hessian(int n, uint32_t seed) {
  const int tokens = 256;
  std::vector<float> x = random_matrix(tokens, n, seed, 1.0f);
  std::mt19937 rng(seed + 7);
  std::uniform_real_distribution<float> u(0.1f, 3.0f);
  std::vector<float> col_scale(static_cast<size_t>(n));
  for (float& s : col_scale) s = u(rng);
  for (int t = 0; t < tokens; ++t)
    for (int i = 0; i < n; ++i) x[static_cast<size_t>(t) * n + i] *= col_scale[i];
  std::vector<double> h(static_cast<size_t>(n) * n, 0.0);
  for (int t = 0; t < tokens; ++t)
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < n; ++k)
        h[static_cast<size_t>(i) * n + k] +=
            2.0 / tokens * x[static_cast<size_t>(t) * n + i] * x[static_cast<size_t>(t) * n + k];
  return h;
}

using qfile::decode_layer;

TEST(QuantMix, SettingAccountingAndValidation) {
  const QuantSetting mix{3, 128, true, 4, 2};
  EXPECT_TRUE(mix.mixed());
  EXPECT_EQ(mix.mix_groups(1024), 2);                                // 8 groups * 2/8
  EXPECT_EQ(mix.mix_groups(384), 1);                                 // 3 groups * 2/8 = 0.75 -> 1
  EXPECT_EQ((QuantSetting{3, 128, true, 4, 7}.mix_groups(256)), 1);  // at most all but one
  // By hand: 8 rows x 1024 columns, 2 of 8 groups at 4 bits, f16 scales per group of 128, and the
  // 2-entry I32 list of groups.
  EXPECT_DOUBLE_EQ(mix.stored_bits(8, 1024), 8.0 * (768 * 3 + 256 * 4) + 8.0 * 8 * 16 + 2 * 32);
  const QuantSetting one{4, 64, false};
  EXPECT_DOUBLE_EQ(one.stored_bits(3, 128), 3.0 * 128 * one.bits_per_weight());
  EXPECT_EQ(mix.str(), "3b g128 sym +2/8 4b");
  auto bad = [](QuantSetting s, int64_t cols) {
    return [s, cols] { quant_setting_validate(s, cols, "x"); };
  };
  for (auto [f, needle] : std::vector<std::pair<std::function<void()>, std::string>>{
           {bad({3, 128, true, 7, 2}, 256), "bits must be"},
           {bad({3, 128, true, 3, 2}, 256), "second width"},
           {bad({3, 128, true, 4, 8}, 256), "1..7"},
           {bad({3, 128, true, 4, 2}, 128), "two groups"},
           {bad({3, 128, true, 0, 2}, 256), "without a mix width"}}) {
    try {
      f();
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
  // The mix candidates fit only layers of at least two groups.
  for (const QuantSetting& s : settings_for(candidate_settings(), 128))
    EXPECT_TRUE(!s.mixed() || s.group_size == 64) << s.str();
}

// Quantizes a layer with a mix, writes it in the file format, loads it, and compares the loaded
// weight and the CPU backend's matmul with the float64 decoding of the file's bytes.
void check_mixed_layer(const QuantSetting& st, int rows, int cols, uint32_t seed) {
  SCOPED_TRACE(st.str());
  const std::vector<float> w = random_matrix(rows, cols, seed, 0.05f);
  const std::vector<double> h = uneven_hessian(cols, seed + 1);
  GptqPrep prep = gptq_prepare(h, cols, 0.01, true);
  prep.clip_search = true;
  const QuantizedWeight q = gptq_quantize(w.data(), rows, cols, prep, st, 2);
  // The wide groups are those with the most input energy.
  ASSERT_EQ(static_cast<int64_t>(q.hi_groups.size()), st.mix_groups(cols));
  std::vector<double> energy(static_cast<size_t>(cols / st.group_size), 0.0);
  for (int c = 0; c < cols; ++c) energy[c / st.group_size] += h[static_cast<size_t>(c) * cols + c];
  for (size_t g = 0; g < energy.size(); ++g) {
    const bool hi = std::find(q.hi_groups.begin(), q.hi_groups.end(), g) != q.hi_groups.end();
    for (int gh : q.hi_groups) {
      if (!hi) {
        EXPECT_GE(energy[gh], energy[g]);
      }
    }
  }
  const std::string dir = ::testing::TempDir() + "/gyre_quant_mix";
  fs::create_directories(dir);
  const std::string path = dir + "/layer.safetensors";
  write_safetensors(path, pack_tensors(q, "x"));
  WeightSet raw, out;
  safetensors_load(path, raw);
  nlohmann::json layer = {{"bits", st.bits}, {"group_size", st.group_size}, {"sym", st.sym}};
  layer["shape"] = {rows, cols};
  layer["mix"] = {{"bits", st.mix_bits}, {"hi_groups", st.mix_groups(cols)}};
  nlohmann::json cfg;
  cfg["quantization_config"] = {{"quant_method", "gyre"}, {"version", 2}};
  cfg["quantization_config"]["layers"]["x"] = layer;
  gyre_quant_load(cfg, raw, out, path);
  const std::vector<double> want = decode_layer(raw, "x", layer);
  const TensorView& t = out.get("x.weight");
  ASSERT_TRUE(is_qmixed_view(t));
  const QMixedHost& m = qmixed_of_view(t);
  ASSERT_EQ(m.parts.size(), 2u);
  EXPECT_EQ(m.parts[0].w.desc.bits, st.mix_bits);
  EXPECT_EQ(m.parts[1].w.desc.bits, st.bits);
  EXPECT_NEAR(m.bits_per_weight() * rows * cols, st.stored_bits(rows, cols), 1e-6);
  std::vector<float> row(static_cast<size_t>(cols));
  int differ = 0;
  for (int r = 0; r < rows; ++r) {
    qmixed_dequantize_row(m, r, row.data());
    for (int c = 0; c < cols; ++c) {
      differ += row[c] != static_cast<float>(want[static_cast<size_t>(r) * cols + c]);
      differ += q.dequant[static_cast<size_t>(r) * cols + c] != row[c];  // what GPTQ measured
    }
  }
  EXPECT_EQ(differ, 0);
  // y = W x through the CPU backend (the weight uploaded as a mix) against float64.
  auto backend = make_cpu_backend(2);
  const int n = 3;
  const std::vector<float> x = random_matrix(n, cols, seed + 2, 1.0f);
  TensorView xv;
  xv.name = "x_rows";
  xv.dtype = DType::F32;
  xv.shape = {n, cols};
  xv.data = x.data();
  xv.nbytes = x.size() * 4;
  const Tensor table = backend->upload_weight(xv), wt = backend->upload_weight(t);
  Tensor xt = backend->alloc(n, cols), yt = backend->alloc(n, rows);
  const std::vector<int32_t> ids = {0, 1, 2};
  backend->embed(xt, table, ids.data(), n);
  backend->matmul(yt, xt, wt, nullptr);
  std::vector<float> y(static_cast<size_t>(n) * rows);
  backend->to_host(yt, y.data());
  for (int i = 0; i < n; ++i)
    for (int r = 0; r < rows; ++r) {
      double ref = 0, mag = 0;
      for (int c = 0; c < cols; ++c) {
        ref += want[static_cast<size_t>(r) * cols + c] * x[static_cast<size_t>(i) * cols + c];
        mag += std::fabs(want[static_cast<size_t>(r) * cols + c] *
                         x[static_cast<size_t>(i) * cols + c]);
      }
      EXPECT_NEAR(y[static_cast<size_t>(i) * rows + r], ref, 1e-5 * mag + 1e-7);
    }
}

TEST(QuantMix, MixedLayerDequantizesAndMultipliesAsItsFileSays) {
  check_mixed_layer({3, 32, true, 4, 2}, 7, 256, 11);
  check_mixed_layer({3, 64, false, 4, 4}, 5, 192, 12);
  check_mixed_layer({2, 128, false, 3, 4}, 4, 256, 13);
  check_mixed_layer({4, 32, true, 5, 6}, 3, 128, 14);
  check_mixed_layer({5, 32, true, 6, 2}, 3, 256, 15);
  check_mixed_layer({6, 32, true, 8, 4}, 3, 128, 16);
}

// A mix spends its extra bits where the input energy is: at the same setting otherwise, its
// error lies between the two widths' errors and below what the same share of *other* groups
// would give. (Checked through the measured relative error GPTQ reports.)
TEST(QuantMix, MixErrorLiesBetweenItsWidths) {
  const int rows = 16, cols = 256;
  const std::vector<float> w = random_matrix(rows, cols, 21, 0.05f);
  const std::vector<double> h = uneven_hessian(cols, 22);
  const GptqPrep prep = gptq_prepare(h, cols, 0.01, true);
  auto err = [&](const QuantSetting& st) {
    return relative_error(w.data(), gptq_quantize(w.data(), rows, cols, prep, st, 2), h, 2);
  };
  const double e3 = err({3, 64, true}), e4 = err({3, 64, true, 4, 4}), e5 = err({4, 64, true});
  EXPECT_LT(e4, e3);
  EXPECT_GT(e4, e5);
}

const std::string kStories = std::string(GYRE_FIXTURES) + "/stories260K";

// stories260K converted with every layer forced to a mix (--uniform with a mix), loaded, run:
// logits equal to those of its float twin, whose F32 weights come from this file's decoding of
// the output's bytes.
// Converts stories260K with every 64-wide projection at the mix `uniform` and checks that the
// quantized model's logits are those of the float twin the test's own decoder makes of the file;
// returns the file's config.json.
nlohmann::json expect_forced_mix_matches_twin(const std::string& dir, const std::string& uniform,
                                              double bpw) {
  ConvertOptions o = qfile::stories_convert_options(dir);
  o.uniform = uniform;
  convert_model(o);
  const std::string out = o.out;
  const auto cfg = nlohmann::json::parse(read_text_file(out + "/config.json"));
  const auto& qc = cfg["quantization_config"];
  EXPECT_EQ(qc["version"], 2);
  EXPECT_NEAR(qc["bits_per_weight"].get<double>(), bpw, 0.01) << uniform;
  WeightSet raw;
  safetensors_load(out + "/model.safetensors", raw);
  auto twin_owner = std::make_shared<std::vector<std::vector<float>>>();
  WeightSet twin;
  int mixed = 0;
  for (const auto& [name, j] : qc["layers"].items()) {
    mixed += j.contains("mix");
    const std::vector<double> d = decode_layer(raw, name, j);
    twin_owner->emplace_back(d.begin(), d.end());
    TensorView v;
    v.name = name + ".weight";
    v.dtype = DType::F32;
    v.shape = {j["shape"][0].get<int64_t>(), j["shape"][1].get<int64_t>()};
    v.data = twin_owner->back().data();
    v.nbytes = twin_owner->back().size() * 4;
    twin.add(v);
  }
  EXPECT_EQ(mixed, 5 * 6);  // every 64-wide projection; down_proj (172 wide) stays F32
  for (const auto& [name, t] : raw.all())
    if (t.dtype != DType::I32 && !twin.has(name) && name.find(".scales") == std::string::npos &&
        name.find(".mins") == std::string::npos)
      twin.add(t);
  const auto q = load_model(out);
  auto backend = make_cpu_backend(2);
  Transformer a(q->config, q->weights, *backend, 64);
  Transformer b(q->config, twin, *backend, 64);
  const mtest::LogitsDiff d = mtest::compare_prompt_logits(b, a, q->config.vocab_size);
  EXPECT_GT(d.max_abs, 0.1);
  EXPECT_LE(d.max_diff, 1e-5 * d.max_abs) << uniform;
  return cfg;
}

TEST(QuantMix, ForcedMixConvertMatchesItsDecodedFloatTwin) {
  // 64-wide layers have two groups of 32: one at 4 bits, one at 3 (+ f16 scale and min each).
  const auto cfg =
      expect_forced_mix_matches_twin("gyre_quant_mix_convert", "3:32:asym:4x4", 3.5 + 32.0 / 32);
  const std::string out = ::testing::TempDir() + "/gyre_quant_mix_convert";
  // Tampering: a mixed layer in a version-1 file, and a hi_groups list out of order.
  auto expect_error = [&](const std::function<void(nlohmann::json&, WeightSet&)>& edit,
                          const std::string& needle) {
    qfile::expect_tampered_load_error(cfg, out, edit, needle);
  };
  const std::string l0 = "model.layers.0.self_attn.q_proj";
  expect_error([](nlohmann::json& c, WeightSet&) { c["quantization_config"]["version"] = 1; },
               "version 2");
  expect_error([&](nlohmann::json& c,
                   WeightSet&) { c["quantization_config"]["layers"][l0]["mix"]["hi_groups"] = 2; },
               "mixed groups");
  expect_error([&](nlohmann::json& c,
                   WeightSet&) { c["quantization_config"]["layers"][l0]["mix"]["bits"] = 5; },
               "expected");
  expect_error(
      [&](nlohmann::json& c, WeightSet&) { c["quantization_config"]["layers"][l0].erase("mix"); },
      "has shape");
  static const int32_t kBadGroup = 7;
  expect_error(
      [&](nlohmann::json&, WeightSet& r) {
        WeightSet copy;
        copy.keep_owner(std::make_shared<WeightSet>(r));  // keeps the mapped file
        for (const auto& [name, t] : r.all()) {
          TensorView v = t;
          if (name == l0 + ".hi_groups") v.data = &kBadGroup;
          copy.add(v);
        }
        r = copy;
      },
      "increasing group indices");
}

// The 8 bpw region's mix (converter candidates 6b g128 +N/8 8b): one group of each 64-wide
// layer at 8 bits, the other at 6 (+ one f16 scale per group).
TEST(QuantMix, SixEightMixMatchesItsDecodedFloatTwin) {
  expect_forced_mix_matches_twin("gyre_quant_mix68_convert", "6:32:sym:8x4", 7.0 + 16.0 / 32);
}

// The choice: with a mix measured as better per bit than either width, the optimizer takes it
// at a budget between the widths; with the mix measured as worse, it does not.
TEST(QuantMix, OptimizerPicksAMixWhenItIsBetterPerBit) {
  const auto m = load_model(kStories);
  for (bool mix_good : {true, false}) {
    Measurement meas;
    meas.blocks_done = m->config.n_layers;
    for (int b = 0; b < m->config.n_layers; ++b)
      for (const char* s : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                            "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj"}) {
        LayerErrors le;
        le.name = layer_tensor(b, s);
        le.rows = m->weights.get(le.name + ".weight").rows();
        le.cols = 64;
        // 3 and 4 bits at error 1.0 and 0.2; the half-and-half mix at 0.3 (better than the
        // average of the widths, 0.6, at their average cost) or 1.1 (worse than 3 bits alone).
        le.errors.push_back({QuantSetting{3, 32, true}, 1.0});
        le.errors.push_back({QuantSetting{4, 32, true}, 0.2});
        le.errors.push_back({QuantSetting{3, 32, true, 4, 4}, mix_good ? 0.3 : 1.1});
        meas.layers.push_back(le);
      }
    // The mix costs 4.0 bits per weight plus its list of groups; 3 bits 3.5, 4 bits 4.5.
    const Plan plan = optimized_plan(*m, meas, 4.05, false);
    int mixes = 0, fours = 0, threes = 0;
    for (const auto& [name, st] : plan) {
      mixes += st.mixed();
      fours += !st.mixed() && st.bits == 4;
      threes += !st.mixed() && st.bits == 3;
    }
    if (mix_good) {
      // Mixes everywhere, but for a few units the 0.05 bits of slack lift to 4 bits.
      EXPECT_EQ(threes, 0);
      EXPECT_GE(mixes, static_cast<int>(plan.size()) * 3 / 4);
    } else {
      EXPECT_EQ(mixes, 0);
      EXPECT_GT(fours, 0);
    }
  }
}

// --no-mixes (QuantContext::mixes false) measures the one-width candidates alone, with the same
// errors as a measurement that includes the mixes (candidates are independent).
TEST(QuantMix, MeasurementWithoutMixesIsTheOneWidthPart) {
  ModelConfig c;
  c.arch = "llama";
  c.dim = 128, c.hidden_dim = 256, c.n_layers = 1, c.n_heads = 4, c.n_kv_heads = 2;
  c.head_dim = 32, c.vocab_size = 100, c.max_seq_len = 32, c.norm_eps = 1e-5f;
  c.rope.rot_dim = 32;
  LoadedModel lm;
  lm.config = c;
  QuantContext ctx;
  ctx.model = &lm;
  ctx.threads = 2;
  ctx.progress = false;
  std::mt19937 rng(5);
  for (int r = 0; r < 4; ++r) {
    std::vector<int> row;
    for (int i = 0; i < 32; ++i) row.push_back(static_cast<int>(rng() % 100));
    ctx.rows.push_back(row);
  }
  ctx.blocks = [&](int layer) { return synthetic_block(c, layer, 2); };
  ctx.embed = [&](const std::vector<std::vector<int>>& rows) {
    std::vector<float> out;
    for (const auto& row : rows)
      for (int id : row)
        for (int k = 0; k < c.dim; ++k) out.push_back(std::sin(0.37f * id + 0.11f * k));
    return out;
  };
  auto backend = make_cpu_backend(2);
  ctx.backend = backend.get();
  Measurement with, without;
  measure(ctx, with, [](const Measurement&) {});
  ctx.mixes = false;
  measure(ctx, without, [](const Measurement&) {});
  ASSERT_EQ(with.layers.size(), 7u);
  ASSERT_EQ(without.layers.size(), 7u);
  size_t mixes = 0;
  for (size_t l = 0; l < with.layers.size(); ++l) {
    const LayerErrors &a = with.layers[l], &b = without.layers[l];
    std::vector<std::pair<QuantSetting, double>> one_width;
    for (const auto& e : a.errors)
      if (e.first.mixed())
        ++mixes;
      else
        one_width.push_back(e);
    ASSERT_EQ(one_width.size(), b.errors.size()) << a.name;
    for (size_t i = 0; i < b.errors.size(); ++i) {
      EXPECT_EQ(one_width[i].first, b.errors[i].first) << a.name;
      EXPECT_EQ(one_width[i].second, b.errors[i].second) << a.name;
    }
  }
  EXPECT_GT(mixes, 0u);  // 3-bit g64 mixes of the 128-wide layers, g128 ones of down_proj
}

}  // namespace
}  // namespace gyre::quant
