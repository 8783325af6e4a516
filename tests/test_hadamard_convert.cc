// `gyre convert --hadamard` end to end on stories260K: the file decoded here (bit streams, f16
// scales, the stored signs, and the explicit float64 Hadamard matrix) gives a float twin whose
// logits the loaded model must reproduce on the CPU; an 8-bit rotated conversion stays close to
// the unrotated original; the loader refuses tampered rotations with one-line errors; and on a
// GPU the CUDA backend's logits (prompt and token-by-token decode) match the CPU's.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/half.h"
#include "core/mapped_file.h"
#include "engine/transformer.h"
#include "model/gyre_quant_loader.h"
#include "model/loader.h"
#include "model/safetensors.h"
#include "model_test_util.h"
#include "quant/convert.h"
#include "quant_file_test_util.h"

namespace gyre::quant {
namespace {

namespace fs = std::filesystem;

const std::string kStories = std::string(GYRE_FIXTURES) + "/stories260K";

std::string convert(const std::string& name, const std::string& uniform, bool hadamard) {
  ConvertOptions o = qfile::stories_convert_options(name);
  o.device = "cpu";
  o.uniform = uniform;
  o.hadamard = hadamard;
  convert_model(o);
  return o.out;
}

// The float64 effective weight (W R)_q R^T of a layer of the file (one width or a mix).
std::vector<double> decode_rotated(const WeightSet& raw, const std::string& name,
                                   const nlohmann::json& j) {
  const int64_t rows = j["shape"][0], cols = j["shape"][1];
  const std::vector<double> wr = qfile::decode_layer(raw, name, j);
  if (!j.contains("hadamard")) return wr;
  const int block = j["hadamard"];
  const TensorView& st = raw.get(name + ".had_signs");
  EXPECT_EQ(st.dtype, DType::I16);
  std::vector<int16_t> s(static_cast<size_t>(cols));
  std::memcpy(s.data(), st.data, s.size() * 2);
  // W = (W R) R^T: W[r][i] = sum_j WR[r][j] R[i][j], R[i][j] = s_i H_B[i % B][j % B] (same block).
  std::vector<double> w(wr.size(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(block));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < cols; ++i) {
      double acc = 0;
      for (int64_t jj = i / block * block; jj < (i / block + 1) * block; ++jj) {
        const unsigned a = static_cast<unsigned>(i % block), b = static_cast<unsigned>(jj % block);
        acc += wr[r * cols + jj] * (std::popcount(a & b) % 2 ? -scale : scale);
      }
      w[r * cols + i] = s[i] * acc;
    }
  return w;
}

// The loaded model's CPU logits against those of its float twin (every layer decoded here).
void expect_twin_logits(const std::string& out, const nlohmann::json& qc) {
  WeightSet raw;
  safetensors_load(out + "/model.safetensors", raw);
  auto owner = std::make_shared<std::vector<std::vector<float>>>();
  WeightSet twin;
  int rotated = 0;
  for (const auto& [name, j] : qc["layers"].items()) {
    if (j.contains("hadamard")) {
      ++rotated;
      EXPECT_EQ(j["hadamard"], 64);  // the 64-wide projections
    }
    const std::vector<double> d = decode_rotated(raw, name, j);
    owner->emplace_back(d.begin(), d.end());
    TensorView v;
    v.name = name + ".weight";
    v.dtype = DType::F32;
    v.shape = {j["shape"][0].get<int64_t>(), j["shape"][1].get<int64_t>()};
    v.data = owner->back().data();
    v.nbytes = owner->back().size() * 4;
    twin.add(v);
  }
  EXPECT_EQ(rotated, 5 * 6);
  for (const auto& [name, t] : raw.all())
    if (t.dtype != DType::I32 && t.dtype != DType::I16 && !twin.has(name) &&
        name.find(".scales") == std::string::npos && name.find(".mins") == std::string::npos)
      twin.add(t);
  const auto q = load_model(out);
  auto cpu = make_cpu_backend(2);
  Transformer a(q->config, q->weights, *cpu, 64);
  Transformer b(q->config, twin, *cpu, 64);
  const mtest::LogitsDiff d = mtest::compare_prompt_logits(b, a, q->config.vocab_size);
  EXPECT_GT(d.max_abs, 0.1);
  EXPECT_LE(d.max_diff, 1e-5 * d.max_abs);
}

// A forced mix of two widths (asymmetric), rotated: the mix's parts hold columns of W R.
TEST(HadamardConvert, RotatedMixDecodesToItsFloatTwin) {
  const std::string out = convert("gyre_had_convert_mix", "3:32:asym:4x4", true);
  const auto cfg = nlohmann::json::parse(read_text_file(out + "/config.json"));
  EXPECT_EQ(cfg["quantization_config"]["version"], 3);
  expect_twin_logits(out, cfg["quantization_config"]);
  if (auto gpu = mtest::cuda_backend_or_null()) {  // the rotated mixed weights on CUDA
    const auto q = load_model(out);
    auto cpu = make_cpu_backend(2);
    Transformer a(q->config, q->weights, *cpu, 64), g(q->config, q->weights, *gpu, 64);
    const mtest::LogitsDiff dg = mtest::compare_prompt_logits(a, g, q->config.vocab_size);
    EXPECT_LE(dg.max_diff, 0.02 * dg.max_abs);
  }
}

TEST(HadamardConvert, RotatedFileDecodesToItsFloatTwinAndStaysCloseToTheOriginal) {
  const std::string out = convert("gyre_had_convert4", "4:32", true);
  const auto cfg = nlohmann::json::parse(read_text_file(out + "/config.json"));
  const auto& qc = cfg["quantization_config"];
  EXPECT_EQ(qc["version"], 3);
  EXPECT_EQ(qc["hadamard"], true);
  expect_twin_logits(out, qc);
  const auto q = load_model(out);
  auto cpu = make_cpu_backend(2);
  Transformer a(q->config, q->weights, *cpu, 64);

  // On a GPU: the CUDA backend against the CPU, the prompt at once and then token by token (the
  // decode path, where norms would otherwise fuse into the GEMV).
  if (auto gpu = mtest::cuda_backend_or_null()) {
    Transformer g(q->config, q->weights, *gpu, 64);
    const mtest::LogitsDiff dg = mtest::compare_prompt_logits(a, g, q->config.vocab_size);
    EXPECT_LE(dg.max_diff, 0.02 * dg.max_abs);
    EXPECT_EQ(dg.same_argmax, dg.positions);
    Transformer a2(q->config, q->weights, *cpu, 64), g2(q->config, q->weights, *gpu, 64);
    const int vocab = q->config.vocab_size;
    std::vector<float> la(static_cast<size_t>(vocab)), lg(la.size());
    double worst = 0, top = 0;
    for (size_t t = 0; t < mtest::kProbeTokens.size(); ++t) {
      a2.forward(&mtest::kProbeTokens[t], 1, static_cast<int>(t), la.data(), false);
      g2.forward(&mtest::kProbeTokens[t], 1, static_cast<int>(t), lg.data(), false);
      for (int i = 0; i < vocab; ++i) {
        worst = std::max(worst, static_cast<double>(std::fabs(la[i] - lg[i])));
        top = std::max(top, static_cast<double>(std::fabs(la[i])));
      }
    }
    EXPECT_LE(worst, 0.02 * top);
  }

  // 8 bits, rotated: close to the unrotated float original.
  const std::string out8 = convert("gyre_had_convert8", "8:32", true);
  const auto q8 = load_model(out8);
  const auto orig = load_model(kStories);
  Transformer t8(q8->config, q8->weights, *cpu, 64), to(orig->config, orig->weights, *cpu, 64);
  const mtest::LogitsDiff d8 = mtest::compare_prompt_logits(to, t8, orig->config.vocab_size);
  EXPECT_LE(d8.max_diff, 0.05 * d8.max_abs);
  EXPECT_GE(d8.same_argmax, d8.positions - 1);

  // Tampering: each a one-line error.
  auto expect_error = [&](const std::function<void(nlohmann::json&, WeightSet&)>& edit,
                          const std::string& needle) {
    qfile::expect_tampered_load_error(cfg, out, edit, needle);
  };
  const std::string l0 = "model.layers.0.self_attn.q_proj";
  expect_error([](nlohmann::json& c, WeightSet&) { c["quantization_config"]["version"] = 2; },
               "version 3");
  expect_error([&](nlohmann::json& c,
                   WeightSet&) { c["quantization_config"]["layers"][l0]["hadamard"] = 48; },
               "not a power of two");
  expect_error([&](nlohmann::json& c,
                   WeightSet&) { c["quantization_config"]["layers"][l0]["hadamard"] = 128; },
               "not a power of two dividing");
  expect_error([&](nlohmann::json& c,
                   WeightSet&) { c["quantization_config"]["layers"][l0].erase("hadamard"); },
               "no hadamard block");
  static const int16_t kBadSigns[64] = {1, 2};
  auto replace_signs = [&](WeightSet& r, const void* data, int64_t n) {
    WeightSet copy;
    copy.keep_owner(std::make_shared<WeightSet>(r));  // keeps the mapped file
    for (const auto& [name, t] : r.all()) {
      TensorView v = t;
      if (name == l0 + ".had_signs") {
        v.data = data;
        v.shape = {n};
        v.nbytes = static_cast<size_t>(n) * 2;
      }
      copy.add(v);
    }
    r = copy;
  };
  expect_error([&](nlohmann::json&, WeightSet& r) { replace_signs(r, kBadSigns, 64); },
               "not +1 or -1");
  expect_error([&](nlohmann::json&, WeightSet& r) { replace_signs(r, kBadSigns, 32); },
               "has shape");
}

}  // namespace
}  // namespace gyre::quant
