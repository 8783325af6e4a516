// GPTQ checkpoints (model/gptq.h) against tests/data/gptq, written by tools/make_gptq_fixture.py
// from the format definition with numpy: every layer case must dequantize bit for bit to the
// spec formula's float32 values, a tiny GPTQ Llama must run exactly as its spec-dequantized
// float twin, and hostile inputs must give one-line errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/fused_weights.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "engine/transformer.h"
#include "model/gptq.h"
#include "model/loader.h"
#include "model/safetensors.h"
#include "model_test_util.h"

namespace gyre {
namespace {

const std::string kDir = std::string(GYRE_SOURCE_DIR) + "/tests/data/gptq";

GptqConfig config_of(const nlohmann::json& quantization_config) {
  GptqConfig c;
  EXPECT_TRUE(gptq_config_from_hf(nlohmann::json{{"quantization_config", quantization_config}}, c));
  return c;
}

struct Case {
  std::string name;
  nlohmann::json qc;
  WeightSet w;
};

std::vector<nlohmann::json> case_list() {
  const auto j = nlohmann::json::parse(read_text_file(kDir + "/layers/cases.json"));
  return j.at("cases").get<std::vector<nlohmann::json>>();
}

void load_case(const nlohmann::json& c, Case& out) {
  out.name = c.at("name").get<std::string>();
  out.qc = c.at("quantization_config");
  safetensors_load(kDir + "/layers/" + out.name + ".safetensors", out.w);
}

QWeightHost convert(const Case& c) {
  const TensorView* g_idx = c.w.has("layer.g_idx") ? &c.w.get("layer.g_idx") : nullptr;
  return gptq_layer_to_qweight(config_of(c.qc), c.name, c.w.get("layer.qweight"),
                               c.w.get("layer.qzeros"), c.w.get("layer.scales"), g_idx);
}

TEST(Gptq, EveryLayerCaseDequantizesToTheSpecValuesExactly) {
  const auto cases = case_list();
  ASSERT_GE(cases.size(), 8u);
  for (const auto& jc : cases) {
    Case c;
    load_case(jc, c);
    SCOPED_TRACE(c.name);
    const QWeightHost q = convert(c);
    const TensorView& expected = c.w.get("expected");
    ASSERT_EQ(q.desc.rows, expected.shape[0]);
    ASSERT_EQ(q.desc.cols, expected.shape[1]);
    EXPECT_EQ(q.desc.bits, c.qc.at("bits").get<int>());
    // Symmetric checkpoints keep Gyre's cheaper symmetric f16 layout.
    EXPECT_EQ(q.desc.asymmetric, !c.qc.at("sym").get<bool>());
    EXPECT_EQ(q.desc.has_perm, c.qc.at("desc_act").get<bool>());
    std::vector<float> row(static_cast<size_t>(q.desc.cols)), want(row.size());
    int mismatches = 0;
    for (int r = 0; r < q.desc.rows; ++r) {
      qweight_dequantize_row(q, r, row.data());
      std::memcpy(want.data(),
                  static_cast<const uint8_t*>(expected.data) + size_t{4} * r * q.desc.cols,
                  want.size() * 4);
      for (size_t i = 0; i < row.size(); ++i) mismatches += row[i] != want[i];
    }
    EXPECT_EQ(mismatches, 0);
  }
}

void expect_forward_equals_float_twin(const std::string& quantized, const std::string& dense_dir,
                                      int bits) {
  SCOPED_TRACE(quantized);
  const auto gptq = load_model(kDir + "/" + quantized);
  const auto dense = load_model(kDir + "/" + dense_dir);
  EXPECT_EQ(gptq->format, "gptq");
  EXPECT_EQ(dense->format, "hf");
  EXPECT_EQ(qweight_of_view(gptq->weights.get("model.layers.0.mlp.down_proj.weight")).desc.bits,
            bits);
  auto backend = make_cpu_backend(2);
  Transformer a(gptq->config, gptq->weights, *backend, 64);
  Transformer b(dense->config, dense->weights, *backend, 64);
  const mtest::LogitsDiff d = mtest::compare_prompt_logits(b, a, gptq->config.vocab_size);
  EXPECT_GT(d.max_abs, 0.1);  // the model does something
  EXPECT_LE(d.max_diff, 1e-5 * d.max_abs);
}

TEST(Gptq, TinyLlamaForwardEqualsItsSpecDequantizedFloatTwin) {
  expect_forward_equals_float_twin("llama", "llama_float", 4);
  expect_forward_equals_float_twin("llama3", "llama3_float", 3);  // 3-bit, act-order, asym
}

// ---- Hostile inputs: one clear line, never a crash. ----

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_one_line_error(const std::function<void()>& f, const std::string& needle) {
  const std::string msg = error_of(f);
  EXPECT_NE(msg, "") << "no error, expected one mentioning '" << needle << "'";
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_NE(msg.find(needle), std::string::npos) << msg;
}

const nlohmann::json* find_case(const std::vector<nlohmann::json>& cases, const std::string& n) {
  for (const auto& c : cases)
    if (c.at("name") == n) return &c;
  return nullptr;
}

TEST(Gptq, HostileLayersGiveOneLineErrors) {
  const auto cases = case_list();
  Case c;
  load_case(*find_case(cases, "a4_g128_act_v2"), c);
  const GptqConfig cfg = config_of(c.qc);
  TensorView qw = c.w.get("layer.qweight"), qz = c.w.get("layer.qzeros");
  TensorView sc = c.w.get("layer.scales"), gi = c.w.get("layer.g_idx");
  auto run = [&](TensorView a, TensorView b, TensorView s, const TensorView* g) {
    return [=] { gptq_layer_to_qweight(cfg, "L", a, b, s, g); };
  };
  TensorView bad = qw;
  bad.shape = {qw.shape[0] - 1, qw.shape[1]};
  expect_one_line_error(run(bad, qz, sc, &gi), "group_size");  // 248 inputs: not whole groups
  bad = qw;
  bad.shape = {qw.shape[0], qw.shape[1], 1};
  expect_one_line_error(run(bad, qz, sc, &gi), "shape");
  bad = qw;
  bad.shape = {int64_t{1} << 60, int64_t{1} << 60};
  expect_one_line_error(run(bad, qz, sc, &gi), "too large");
  bad = qw;
  bad.nbytes -= 4;  // truncated
  expect_one_line_error(run(bad, qz, sc, &gi), "too few bytes");
  bad = qw;
  bad.dtype = DType::F32;
  expect_one_line_error(run(bad, qz, sc, &gi), "expected I32");
  bad = sc;
  bad.shape = {sc.shape[0] + 1, sc.shape[1]};
  expect_one_line_error(run(qw, qz, bad, &gi), "scales");
  bad = qz;
  bad.shape = {qz.shape[0], qz.shape[1] + 1};
  expect_one_line_error(run(qw, bad, sc, &gi), "qzeros");
  bad = gi;
  bad.shape = {gi.shape[0] - 1};
  expect_one_line_error(run(qw, qz, sc, &bad), "g_idx");

  // g_idx values: out of range, and groups of unequal size.
  std::vector<int32_t> idx(static_cast<size_t>(gi.shape[0]));
  std::memcpy(idx.data(), gi.data, idx.size() * 4);
  std::vector<int32_t> hostile = idx;
  hostile[7] = 2;  // only groups 0 and 1 exist
  bad = gi;
  bad.data = hostile.data();
  expect_one_line_error(run(qw, qz, sc, &bad), "outside");
  hostile = idx;
  hostile[7] = -5;
  expect_one_line_error(run(qw, qz, sc, &bad), "outside");
  hostile = idx;
  for (auto& g : hostile) g = 0;  // every column in group 0
  expect_one_line_error(run(qw, qz, sc, &bad), "exactly");
}

TEST(Gptq, UnsupportedConfigsGiveOneLineErrors) {
  GptqConfig c;
  auto cfg = [](nlohmann::json q) { return nlohmann::json{{"quantization_config", q}}; };
  EXPECT_FALSE(gptq_config_from_hf(nlohmann::json{{"hidden_size", 8}}, c));
  const nlohmann::json base = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}};
  auto with = [&](const char* key, nlohmann::json v) {
    nlohmann::json q = base;
    q[key] = v;
    return [q, cfg, &c] { gptq_config_from_hf(cfg(q), c); };
  };
  expect_one_line_error(with("bits", 5), "5 bits");
  expect_one_line_error(with("bits", 6), "6 bits");
  expect_one_line_error(with("bits", "four"), "quantization_config");
  expect_one_line_error(with("group_size", 0), "group_size");
  expect_one_line_error(with("checkpoint_format", "marlin"), "marlin");
  expect_one_line_error(with("quant_method", "awq"), "awq");
  expect_one_line_error([&] { gptq_config_from_hf(cfg(nlohmann::json(5)), c); },
                        "quantization_config");
  // 4-bit groups of 16 have no Gyre kernel.
  nlohmann::json q16 = base;
  q16["group_size"] = 16;
  const GptqConfig c16 = config_of(q16);
  Case cs;
  load_case(*find_case(case_list(), "s4_g32_v1"), cs);
  expect_one_line_error(
      [&] {
        gptq_layer_to_qweight(c16, "L", cs.w.get("layer.qweight"), cs.w.get("layer.qzeros"),
                              cs.w.get("layer.scales"), nullptr);
      },
      "16");
}

// 3-bit packing (32 values per 3 words along each dimension): shapes that cannot hold whole
// units, and truncated data.
TEST(Gptq, Hostile3BitLayersGiveOneLineErrors) {
  Case c;
  load_case(*find_case(case_list(), "a3_g128_act_v2"), c);
  const GptqConfig cfg = config_of(c.qc);
  ASSERT_EQ(cfg.bits, 3);
  const TensorView qw = c.w.get("layer.qweight"), qz = c.w.get("layer.qzeros");
  const TensorView sc = c.w.get("layer.scales"), gi = c.w.get("layer.g_idx");
  EXPECT_EQ(qw.shape, (std::vector<int64_t>{256 * 3 / 32, 32}));
  EXPECT_EQ(qz.shape, (std::vector<int64_t>{2, 3}));
  auto run = [&](TensorView a, TensorView b, TensorView s, const TensorView* g) {
    return [=] { gptq_layer_to_qweight(cfg, "L", a, b, s, g); };
  };
  TensorView bad = qw;
  bad.shape = {qw.shape[0] - 1, qw.shape[1]};  // 23 words: not whole 3-word units
  expect_one_line_error(run(bad, qz, sc, &gi), "multiple of 3");
  bad = qw;
  bad.nbytes = 4 * 3 * 32 - 4;  // truncated
  expect_one_line_error(run(bad, qz, sc, &gi), "too few bytes");
  bad = qz;
  bad.shape = {qz.shape[0], 2};
  expect_one_line_error(run(qw, bad, sc, &gi), "qzeros");
  // 16 outputs: half a qzeros unit.
  TensorView narrow_w = qw, narrow_s = sc, narrow_z = qz;
  narrow_w.shape = {qw.shape[0], 16};
  narrow_s.shape = {sc.shape[0], 16};
  narrow_z.shape = {qz.shape[0], 1};
  expect_one_line_error(run(narrow_w, narrow_z, narrow_s, &gi), "whole qzeros words");
  // The 4-bit fixture read as 3-bit: 32 words are not whole 3-word units.
  Case c4;
  load_case(*find_case(case_list(), "s4_g32_v1"), c4);
  expect_one_line_error(
      [&] {
        gptq_layer_to_qweight(cfg, "L", c4.w.get("layer.qweight"), c4.w.get("layer.qzeros"),
                              c4.w.get("layer.scales"), nullptr);
      },
      "GPTQ layer L");
}

TEST(Gptq, ModelWithoutItsQzerosFailsToLoad) {
  WeightSet w;
  safetensors_load(kDir + "/layers/s4_g32_v1.safetensors", w);
  auto partial = std::make_shared<WeightSet>();
  partial->add(w.get("layer.qweight"));
  partial->add(w.get("layer.scales"));
  GptqConfig c;
  WeightSet out;
  expect_one_line_error([&] { gptq_load_weights(c, partial, out); }, "qzeros");
}

TEST(Gptq, TruncatedOrMisconfiguredModelFoldersGiveOneLineErrors) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "gyre_gptq_hostile";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"})
    fs::copy_file(kDir + "/llama/" + f, dir / f);
  const auto size = fs::file_size(dir / "model.safetensors");
  fs::resize_file(dir / "model.safetensors", size - 1000);
  expect_one_line_error([&] { load_model(dir.string()); }, "model.safetensors");
  fs::copy_file(kDir + "/llama/model.safetensors", dir / "model.safetensors",
                fs::copy_options::overwrite_existing);
  // The checkpoint says 8 bits but its tensors hold 4-bit packing: the shapes disagree.
  auto cfg = nlohmann::json::parse(read_text_file(kDir + "/llama/config.json"));
  cfg["quantization_config"]["bits"] = 8;
  std::ofstream(dir / "config.json") << cfg.dump();
  expect_one_line_error([&] { load_model(dir.string()); }, "GPTQ layer");
  fs::remove_all(dir);
}

TEST(Gptq, LoadedModelHasPackedProjectionsAndNoGptqTensors) {
  const auto m = load_model(kDir + "/llama");
  int packed = 0;
  for (const auto& [name, t] : m->weights.all()) {
    EXPECT_EQ(name.find(".qweight"), std::string::npos) << name;
    EXPECT_EQ(name.find(".g_idx"), std::string::npos) << name;
    if (t.dtype == DType::QPACKED) {
      ++packed;
      const QWeightHost& q = qweight_of_view(t);
      EXPECT_EQ(q.desc.bits, 4);
      EXPECT_TRUE(q.desc.asymmetric);
      EXPECT_TRUE(q.desc.has_perm);  // desc_act
    }
  }
  EXPECT_EQ(packed, 2 * 7);
  TensorView bad = m->weights.get("model.layers.0.self_attn.q_proj.weight");
  bad.shape = {bad.shape[1], bad.shape[0] + 1};
  expect_one_line_error([&] { qweight_of_view(bad); }, "packed weight");
}

// Fused gate/up and Q|K|V of packed weights (what the CUDA backend uploads) hold the parts' rows
// where fuse_views puts them for any other dtype: compared through the float rows.
TEST(Gptq, InterleavedAndConcatenatedPackedRowsMatchFuseViews) {
  Case a, b;
  const auto cases = case_list();
  load_case(*find_case(cases, "s4_g32_v1"), a);
  const QWeightHost qa = convert(a);
  // A second weight of the same layout: the first with its rows reversed.
  QWeightHost qb = qa;
  const size_t qrow = static_cast<size_t>(qa.desc.cols) / 2, srow = qa.desc.groups_per_row() * 2;
  for (int r = 0; r < qa.desc.rows; ++r) {
    const int src = qa.desc.rows - 1 - r;
    std::memcpy(&qb.qweight[r * qrow], &qa.qweight[src * qrow], qrow);
    std::memcpy(&qb.scales[r * srow], &qa.scales[src * srow], srow);
  }
  auto floats = [](const QWeightHost& q, std::vector<float>& f) {
    f.resize(static_cast<size_t>(q.desc.rows) * q.desc.cols);
    for (int r = 0; r < q.desc.rows; ++r) qweight_dequantize_row(q, r, &f[r * q.desc.cols]);
    TensorView v;
    v.name = "w";
    v.dtype = DType::F32;
    v.shape = {q.desc.rows, q.desc.cols};
    v.data = f.data();
    v.nbytes = f.size() * 4;
    return v;
  };
  std::vector<float> fa, fb, fz;
  const TensorView va = floats(qa, fa), vb = floats(qb, fb);
  for (int block : {0, 8, 5}) {
    SCOPED_TRACE(block);
    std::vector<uint8_t> storage;
    const TensorView want = fuse_views({va, vb}, block, storage);
    const QWeightHost got =
        block == 0 ? qweight_concat_rows({&qa, &qb}) : qweight_interleave_rows(qa, qb, block);
    const TensorView vg = floats(got, fz);
    ASSERT_EQ(vg.shape, want.shape);
    // Compared as floats: padding rows have zero scales, giving -0 where fuse_views has +0.
    const auto* g = static_cast<const float*>(vg.data);
    const auto* e = static_cast<const float*>(want.data);
    int differ = 0;
    for (int64_t i = 0; i < vg.numel(); ++i) differ += g[i] != e[i];
    EXPECT_EQ(differ, 0);
  }
  Case c;
  load_case(*find_case(cases, "a4_g32_v1_noidx"), c);
  EXPECT_FALSE(qweight_same_layout(qa, convert(c)));
  expect_one_line_error([&] { qweight_interleave_rows(qa, convert(c), 8); }, "layout");
}

}  // namespace
}  // namespace gyre
