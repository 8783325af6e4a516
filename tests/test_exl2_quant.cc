// EXL2 layers kept quantized (model/exl2.h, exl2_quantize_layer) against tests/data/exl2, written
// by tools/make_exl2_fixture.py with numpy from the format definition: each layer case's numpy
// values ("expected", EXL2's fp16 weights) are the oracle. Gyre's quantized value is the exact
// product (q - 2^(bits-1)) * s, whose fp16 rounding must be the numpy value bit for bit (and
// differ from it by at most half an fp16 step); which layers stay quantized follows from the
// case's group table in cases.json, classified here from the format's rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/qlinear_ref.h"
#include "backend/cpu/qmixed.h"
#include "core/half.h"
#include "core/mapped_file.h"
#include "engine/transformer.h"
#include "model/exl2.h"
#include "model/loader.h"
#include "model/safetensors.h"
#include "model_test_util.h"

namespace gyre {
namespace {

const std::string kDir = std::string(GYRE_SOURCE_DIR) + "/tests/data/exl2";

Exl2Tensors tensors_of(const WeightSet& w, const std::string& p) {
  auto find = [&](const char* n) { return w.has(p + n) ? &w.get(p + n) : nullptr; };
  return {find(".q_weight"), find(".q_scale"),   find(".q_scale_max"),
          find(".q_groups"), find(".q_invperm"), find(".q_perm")};
}

// The expected fate of a layer from its (bits, rows) groups, by the format rules of model/exl2.h:
// each width's groups all of its first's supported size (32, 64, 128 or 256 rows, 16 too at 8
// bits) but a shorter last one, or a single group of at most 256 rows; then `group` holds each
// width's group size (the last group padded to it). "fallback" otherwise.
std::string expected_layout(const std::vector<std::pair<int, int>>& groups,
                            std::map<int, int>& group) {
  std::map<int, std::vector<int>> rows_of;
  for (const auto& [bits, rows] : groups) rows_of[bits].push_back(rows);
  auto supported = [](int bits, int r) {
    return r == 32 || r == 64 || r == 128 || r == 256 || (bits == 8 && r == 16);
  };
  for (const auto& [bits, rows] : rows_of) {
    if (rows.size() == 1) {
      int size = 0;
      for (int r : {16, 32, 64, 128, 256})
        if (size == 0 && r >= rows[0] && supported(bits, r)) size = r;
      if (size == 0) return "fallback";
      group[bits] = size;
      continue;
    }
    if (!supported(bits, rows[0])) return "fallback";
    for (size_t i = 1; i < rows.size(); ++i)
      if (rows[i] > rows[0] || (i + 1 < rows.size() && rows[i] != rows[0])) return "fallback";
    group[bits] = rows[0];
  }
  return "";
}

// Row-major [N, K] floats of a quantized layer, in the original column order.
// (single or mixed is set.)
std::vector<float> dequantize(const QWeightHost* single, const QMixedHost* mixed) {
  const int rows = single ? single->desc.rows : mixed->rows;
  const int cols = single ? single->desc.cols : mixed->cols;
  std::vector<float> w(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r) {
    float* out = w.data() + static_cast<size_t>(r) * cols;
    single ? qweight_dequantize_row(*single, r, out) : qmixed_dequantize_row(*mixed, r, out);
  }
  return w;
}

uint16_t half_bits(float f) {
  return f32_to_f16(f);
}

// Compares a quantized layer with EXL2's fp16 values; returns the count of values whose exact
// product is not itself an fp16 number (EXL2 rounds those).
int64_t expect_exl2_values(const QWeightHost* single, const QMixedHost* mixed, const float* want,
                           size_t count, const std::string& what) {
  const std::vector<float> got = dequantize(single, mixed);
  EXPECT_EQ(got.size(), count) << what;
  int64_t mismatches = 0, too_far = 0, rounded = 0;
  for (size_t i = 0; i < std::min(got.size(), count); ++i) {
    mismatches += half_bits(got[i]) != half_bits(want[i]);  // the sign of zeros included
    rounded += f16_to_f32(half_bits(got[i])) != got[i];
    // Half an fp16 step of |want| (at least the subnormal step): 2^-11 relative.
    const double step =
        std::max(std::ldexp(std::fabs(static_cast<double>(want[i])), -11), std::ldexp(1.0, -25));
    too_far += std::fabs(static_cast<double>(got[i]) - want[i]) > step;
  }
  EXPECT_EQ(mismatches, 0) << what;
  EXPECT_EQ(too_far, 0) << what;
  return rounded;
}

TEST(Exl2Quant, LayerCasesKeepExl2ValuesOrFallBackForTheFormatsReasons) {
  const auto cases = nlohmann::json::parse(read_text_file(kDir + "/layers/cases.json"));
  int quantized = 0, single = 0, mixed = 0, fallback = 0, padded_parts = 0;
  for (const auto& j : cases.at("cases")) {
    const std::string name = j.at("name");
    const int64_t in = j.at("in"), out = j.at("out");
    WeightSet w;
    safetensors_load(kDir + "/layers/" + name + ".safetensors", w);
    const auto groups = j.at("groups").get<std::vector<std::pair<int, int>>>();
    const Exl2Tensors t = tensors_of(w, "layer");
    const Exl2Quantized q = exl2_quantize_layer(name, t, out);
    std::map<int, int> group;
    const std::string want = expected_layout(groups, group);
    if (!want.empty()) {
      ++fallback;
      EXPECT_FALSE(q.single || q.mixed) << name;
      EXPECT_EQ(q.reason, "an unsupported group size") << name;
      continue;
    }
    ASSERT_TRUE(q.single || q.mixed) << name << ": " << q.reason;
    // Padded rows: each width's groups rounded up to its group size.
    std::map<int, int64_t> real, stored;
    for (const auto& [bits, rows] : groups) {
      real[bits] += rows;
      stored[bits] += group[bits];
    }
    bool padded = false;
    for (const auto& [bits, rows] : real) padded = padded || stored[bits] != rows;
    EXPECT_EQ(q.mixed != nullptr, group.size() > 1 || padded) << name;
    ++quantized;
    (q.single ? single : mixed)++;
    if (q.mixed) padded_parts += padded;
    const TensorView& e = w.get("expected", {out, in});
    std::vector<float> expected(static_cast<size_t>(out * in));
    std::memcpy(expected.data(), e.data, expected.size() * 4);
    expect_exl2_values(q.single.get(), q.mixed.get(), expected.data(), expected.size(), name);

    // Memory: the integers take the checkpoint's bits exactly (every group fills whole words
    // here, padding rows included), plus one f16 scale per group and column (EXL2: 4 bits + 1/G
    // f16); a mix holds one part per width, widest first, each listing its input columns.
    int64_t code_bits = 0;
    for (const auto& [bits, rows] : stored) code_bits += bits * rows * out;
    std::vector<const QWeightHost*> parts;
    if (q.single) parts.push_back(q.single.get());
    if (q.mixed) {
      ASSERT_EQ(q.mixed->parts.size(), group.size()) << name;
      auto width = group.rbegin();
      for (const QMixedPart& p : q.mixed->parts) {
        parts.push_back(&p.w);
        EXPECT_EQ(p.w.desc.bits, width->first) << name;
        EXPECT_EQ(p.w.desc.group_size, width->second) << name;
        EXPECT_EQ(static_cast<int64_t>(std::count(p.cols.begin(), p.cols.end(), -1)),
                  stored[width->first] - real[width->first])
            << name;
        ++width;
      }
    }
    int64_t qbytes = 0, sbytes = 0;
    for (const QWeightHost* p : parts)
      qbytes += static_cast<int64_t>(p->qweight.size()), sbytes += p->scales.size();
    EXPECT_EQ(qbytes * 8, code_bits) << name;
    EXPECT_EQ(sbytes, static_cast<int64_t>(groups.size()) * out * 2) << name;
    if (t.q_weight->shape[1] == out && !padded) {
      EXPECT_EQ(qbytes, static_cast<int64_t>(t.q_weight->nbytes)) << name;
    }
  }
  EXPECT_GE(single, 1);
  EXPECT_GE(mixed, 4);
  EXPECT_GE(padded_parts, 3);  // 3 widths with a short last group, one width padded, ...
  EXPECT_GE(fallback, 3);
  EXPECT_EQ(quantized + fallback, static_cast<int>(cases.at("cases").size()));
}

TEST(Exl2Quant, TinyLlamaKeepsEveryLayerQuantizedWithExl2Values) {
  ::testing::internal::CaptureStderr();
  const auto m = load_model(kDir + "/llama");
  const std::string log = ::testing::internal::GetCapturedStderr();
  const auto dense = load_model(kDir + "/llama_float");  // EXL2's fp16 values, from numpy
  // The fixture's mixes (make_exl2_fixture.py LLAMA_BITS, HEAD_BITS): per decoder layer q, k, o,
  // gate (two widths) and down (6/4/3 bits, the 3-bit group of 44 rows padded to 64) are mixes,
  // v and up (one width) packed weights; the head (8/6 bits) is a mix.
  int singles = 0, mixes = 0, three_widths = 0;
  int64_t rounded = 0, total = 0;
  for (const auto& [name, t] : m->weights.all()) {
    if (name.find("proj") == std::string::npos && name != "lm_head.weight") continue;
    const TensorView& d = dense->weights.get(name, t.shape);
    ASSERT_EQ(d.dtype, DType::F16);
    std::vector<float> want(static_cast<size_t>(d.numel()));
    for (size_t i = 0; i < want.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, static_cast<const uint8_t*>(d.data) + i * 2, 2);
      want[i] = f16_to_f32(h);
    }
    const bool down = name.find("down_proj") != std::string::npos;
    ASSERT_EQ(t.dtype, DType::QPACKED) << name;
    const QMixedHost* mixed = is_qmixed_view(t) ? &qmixed_of_view(t) : nullptr;
    const QWeightHost* single = mixed ? nullptr : &qweight_of_view(t);
    if (mixed) {
      ++mixes;
      three_widths += mixed->parts.size() == 3;
      EXPECT_EQ(mixed->parts.size() == 3, down) << name;
    } else {
      ++singles;
      const bool one_width =
          name.find("v_proj") != std::string::npos || name.find("up_proj") != std::string::npos;
      EXPECT_TRUE(one_width) << name;
    }
    rounded += expect_exl2_values(single, mixed, want.data(), want.size(), name);
    total += static_cast<int64_t>(want.size());
  }
  EXPECT_EQ(singles, 2 * 2);
  EXPECT_EQ(mixes, 2 * 5 + 1);
  EXPECT_EQ(three_widths, 2);
  EXPECT_NE(log.find("EXL2: 15 of 15 layers kept quantized, 0 dequantized to F16"),
            std::string::npos)
      << log;
  // Most exact products need no rounding, but some do: the CPU's f32 values are then within half
  // an fp16 step of EXL2's (checked above), which the logits test below bounds end to end.
  EXPECT_GT(rounded, 0);
  std::printf("exl2: %lld of %lld quantized weights are not fp16 numbers as exact products\n",
              static_cast<long long>(rounded), static_cast<long long>(total));
}

// The engine fuses q|k|v and gate|up into one weight of one dtype: a quantizable layer whose
// fused partner falls back to F16 must be F16 too, and the log line counts every reason.
TEST(Exl2Quant, FusedPartnersOfADequantizedLayerAreDequantizedAndReported) {
  // Layer cases as projections of a model with 32-wide (padded) outputs everywhere.
  auto load = [](const char* name) {
    auto w = std::make_shared<WeightSet>();
    safetensors_load(kDir + "/layers/" + name + ".safetensors", *w);
    return w;
  };
  const auto fallback = load("b4_uneven"), single = load("b4_noperm"), mix = load("head_8_6_bias");
  auto raw = std::make_shared<WeightSet>();
  auto add_as = [&](const WeightSet& from, const std::string& prefix) {
    for (const auto& [name, t] : from.all()) {
      if (name.rfind("layer.", 0) != 0) continue;
      TensorView v = t;
      v.name = prefix + name.substr(5);
      raw->add(v);
    }
  };
  add_as(*fallback, "model.layers.0.mlp.gate_proj");
  add_as(*single, "model.layers.0.mlp.up_proj");
  add_as(*mix, "model.layers.0.self_attn.o_proj");
  add_as(*single, "model.layers.1.mlp.up_proj");  // its gate is not in the file: kept
  ModelConfig c;
  c.dim = 32;
  c.hidden_dim = 32;
  WeightSet out;
  ::testing::internal::CaptureStderr();
  const Exl2LoadReport report = exl2_load_weights(c, raw, out);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(out.get("model.layers.0.mlp.gate_proj.weight").dtype, DType::F16);
  EXPECT_EQ(out.get("model.layers.0.mlp.up_proj.weight").dtype, DType::F16);
  EXPECT_TRUE(is_qmixed_view(out.get("model.layers.0.self_attn.o_proj.weight")));
  EXPECT_EQ(out.get("model.layers.1.mlp.up_proj.weight").dtype, DType::QPACKED);
  EXPECT_EQ(report.quantized, 2);
  EXPECT_EQ(report.dequantized, 2);
  EXPECT_NE(log.find("EXL2: 2 of 4 layers kept quantized, 2 dequantized to F16 (1 with an "
                     "unsupported group size, 1 with a dequantized fused partner)"),
            std::string::npos)
      << log;
  // The dequantized partner holds EXL2's values (the case's numpy "expected").
  const TensorView& up = out.get("model.layers.0.mlp.up_proj.weight", {32, 256});
  const TensorView& want = single->get("expected", {32, 256});
  for (int64_t i = 0; i < up.numel(); ++i) {
    uint16_t h;
    float f;
    std::memcpy(&h, static_cast<const uint8_t*>(up.data) + i * 2, 2);
    std::memcpy(&f, static_cast<const uint8_t*>(want.data) + i * 4, 4);
    ASSERT_EQ(h, f32_to_f16(f)) << i;
  }
}

TEST(Exl2Quant, TinyLlamaLogitsMatchTheFp16Twin) {
  const auto exl2 = load_model(kDir + "/llama");
  const auto dense = load_model(kDir + "/llama_float");
  auto backend = make_cpu_backend(2);
  Transformer a(exl2->config, exl2->weights, *backend, 64);
  Transformer b(dense->config, dense->weights, *backend, 64);
  const int n = static_cast<int>(mtest::kProbeTokens.size());
  const mtest::LogitsDiff d = mtest::compare_prompt_logits(b, a, exl2->config.vocab_size);
  const double max_diff = d.max_diff, max_abs = d.max_abs;
  const int argmax_same = d.same_argmax;
  std::printf("exl2 logits: max |quantized - fp16 twin| %.3g of max |logit| %.3g\n", max_diff,
              max_abs);
  EXPECT_GT(max_abs, 0.1);
  // Each weight differs from EXL2's fp16 value by at most 2^-11 relative (the product rounding):
  // the logits may move by about that much, far below the FP16 tolerance of the CUDA tests.
  EXPECT_LE(max_diff, 1e-3 * max_abs);  // measured: 2.4e-4
  EXPECT_EQ(argmax_same, n);
}

}  // namespace
}  // namespace gyre
