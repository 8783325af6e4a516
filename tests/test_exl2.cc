// EXL2 checkpoints (model/exl2.h) against tests/data/exl2, written by tools/make_exl2_fixture.py
// from the format definition with numpy (its reader unpacks bit arrays, independently of its
// packer): every layer case must dequantize bit for bit to the numpy values and hostile inputs
// must give one-line errors (layers kept quantized and the tiny model: test_exl2_quant.cc).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "engine/transformer.h"
#include "model/exl2.h"
#include "model/loader.h"
#include "model/safetensors.h"

namespace gyre {
namespace {

const std::string kDir = std::string(GYRE_SOURCE_DIR) + "/tests/data/exl2";

std::vector<nlohmann::json> case_list() {
  const auto j = nlohmann::json::parse(read_text_file(kDir + "/layers/cases.json"));
  return j.at("cases").get<std::vector<nlohmann::json>>();
}

struct Case {
  std::string name;
  int64_t in = 0, out = 0;
  WeightSet w;
  Exl2Tensors tensors() const {
    auto find = [&](const char* n) {
      return w.has(std::string("layer.") + n) ? &w.get(std::string("layer.") + n) : nullptr;
    };
    return {find("q_weight"), find("q_scale"),   find("q_scale_max"),
            find("q_groups"), find("q_invperm"), find("q_perm")};
  }
};

void load_case(const std::string& name, Case& c) {
  for (const auto& j : case_list()) {
    if (j.at("name") != name) continue;
    c.name = name;
    c.in = j.at("in").get<int64_t>();
    c.out = j.at("out").get<int64_t>();
    safetensors_load(kDir + "/layers/" + name + ".safetensors", c.w);
    return;
  }
  FAIL() << "no case " << name;
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(Exl2, EveryLayerCaseDequantizesToTheNumpyValuesExactly) {
  int cases = 0;
  for (const auto& j : case_list()) {
    Case c;
    load_case(j.at("name").get<std::string>(), c);
    const std::vector<float> w = exl2_dequantize(c.name, c.tensors(), c.out);
    const TensorView& e = c.w.get("expected", {c.out, c.in});
    ASSERT_EQ(w.size(), static_cast<size_t>(c.out * c.in)) << c.name;
    int64_t mismatches = 0, nonzero = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      float want;
      std::memcpy(&want, static_cast<const uint8_t*>(e.data) + i * 4, 4);
      mismatches += bits_of(w[i]) != bits_of(want);
      nonzero += want != 0.0f;
    }
    EXPECT_EQ(mismatches, 0) << c.name;
    EXPECT_GT(nonzero, static_cast<int64_t>(w.size()) / 2) << c.name;
    ++cases;
  }
  EXPECT_GE(cases, 6);
}

TEST(Exl2, ConfigIsDetectedByQuantMethod) {
  Exl2Config c;
  auto cfg = [](nlohmann::json q) { return nlohmann::json{{"quantization_config", q}}; };
  EXPECT_FALSE(exl2_config_from_hf(nlohmann::json{{"hidden_size", 8}}, c));
  EXPECT_FALSE(exl2_config_from_hf(cfg({{"quant_method", "gptq"}, {"bits", 4}}), c));
  EXPECT_FALSE(exl2_config_from_hf(cfg(nlohmann::json(5)), c));
  ASSERT_TRUE(
      exl2_config_from_hf(cfg({{"quant_method", "exl2"}, {"bits", 4.65}, {"head_bits", 6}}), c));
  EXPECT_DOUBLE_EQ(c.bits, 4.65);
  EXPECT_DOUBLE_EQ(c.head_bits, 6);
  EXPECT_THROW(exl2_config_from_hf(cfg({{"quant_method", "exl2"}, {"bits", "four"}}), c), Error);
}

// The tiny model's quantized and F16 layers and its logits: tests/test_exl2_quant.cc.

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

// A tensor's bytes copied so that a test can change them.
struct Owned {
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  TensorView view;
  std::vector<uint8_t> bytes;
  explicit Owned(const TensorView& v)
      : view(v),
        bytes(static_cast<const uint8_t*>(v.data), static_cast<const uint8_t*>(v.data) + v.nbytes) {
    view.data = bytes.data();
  }
  template <typename T>
  void set(int64_t i, T value) {
    std::memcpy(bytes.data() + i * sizeof(T), &value, sizeof(T));
  }
};

TEST(Exl2, HostileLayersGiveOneLineErrors) {
  Case c;
  load_case("mix_all_widths", c);  // groups 8/32, 6/32, 5/32, 4/64, 3/32, 2/32; 48 of 64 columns
  const Exl2Tensors good = c.tensors();
  auto run = [&](Exl2Tensors t, int64_t out = 48) {
    return [t, out, &c] { exl2_dequantize(c.name, t, out); };
  };
  EXPECT_EQ(error_of(run(good)), "");  // the untouched case loads

  Exl2Tensors t = good;
  t.q_scale = nullptr;
  expect_one_line_error(run(t), "missing q_scale");
  expect_one_line_error(run(good, 70), "padded to 32");
  expect_one_line_error(run(good, 16), "padded to 32");

  Owned qw(*good.q_weight);
  t = good;
  t.q_weight = &qw.view;
  qw.view.nbytes -= 4;  // truncated
  expect_one_line_error(run(t), "too few bytes");
  qw.view.nbytes += 4;
  qw.view.dtype = DType::F32;
  expect_one_line_error(run(t), "expected I32");
  qw.view.dtype = DType::I32;
  qw.view.shape = {good.q_weight->shape[0] * 2, 32};  // same bytes, 32 columns
  expect_one_line_error(run(t), "padded to 32");
  qw.view.shape = {good.q_weight->shape[0] * 4, 16};
  expect_one_line_error(run(t, -1), "multiple of 32");
  qw.view.shape = {good.q_weight->shape[0] - 1, good.q_weight->shape[1]};  // last rows missing
  expect_one_line_error(run(t), "last group");
  qw.view.shape = {int64_t{1} << 40, 64};
  expect_one_line_error(run(t), "shape");

  // The group table.
  Owned qg(*good.q_groups);
  t = good;
  t.q_groups = &qg.view;
  auto with_group = [&](int64_t i, int16_t v, const std::string& needle) {
    const std::vector<uint8_t> keep = qg.bytes;
    qg.set<int16_t>(i, v);
    expect_one_line_error(run(t), needle);
    qg.bytes = keep;
    qg.view.data = qg.bytes.data();
  };
  with_group(0, 7, "7 bits");
  with_group(2, 8, "EXL2 layer");   // 8 bits after 8: the rows no longer add up
  with_group(10, 4, "decreasing");  // a 4-bit group after the 3-bit one
  with_group(1, 3, "first group");
  with_group(3, 1000, "outside");
  with_group(3, -2, "outside");
  with_group(5, 8, "outside");       // not increasing
  with_group(3, 7, "whole number");  // the 6-bit group spans 7 words: 224 / 6 rows
  qg.view.shape = {11};
  expect_one_line_error(run(t), "pairs");
  qg.view.shape = {10};  // one group fewer: the 3-bit group takes the 2-bit rows
  expect_one_line_error(run(t), "last group");

  Owned sc(*good.q_scale), sm(*good.q_scale_max);
  t = good;
  t.q_scale = &sc.view;
  sc.view.shape = {5, 8};
  expect_one_line_error(run(t), "q_scale has shape");
  t = good;
  t.q_scale_max = &sm.view;
  sm.set<uint16_t>(2, 0x7e00);  // NaN
  expect_one_line_error(run(t), "not finite");
  sm.view.shape = {5};
  expect_one_line_error(run(t), "q_scale_max has 5");

  // The permutation.
  Owned ip(*good.q_invperm), pp(*good.q_perm);
  t = good;
  t.q_invperm = &ip.view;
  ip.set<int32_t>(3, ip.view.shape[0]);
  expect_one_line_error(run(t), "permutation");
  Owned dup(*good.q_invperm);
  t.q_invperm = &dup.view;
  int32_t first;
  std::memcpy(&first, dup.bytes.data(), 4);
  dup.set<int32_t>(1, first);  // a duplicate
  expect_one_line_error(run(t), "permutation");
  dup.view.shape = {dup.view.shape[0] - 1};
  expect_one_line_error(run(t), "EXL2 layer");
  t = good;
  t.q_perm = &pp.view;
  int32_t a, b;
  std::memcpy(&a, pp.bytes.data(), 4);
  std::memcpy(&b, pp.bytes.data() + 4, 4);
  pp.set<int32_t>(0, b);
  pp.set<int32_t>(1, a);
  expect_one_line_error(run(t), "inverse");
}

// Random corruption of every tensor of a small layer: either a clean load or a gyre::Error,
// never a crash or an out-of-bounds read (the sanitizer build checks the latter).
TEST(Exl2, FuzzedLayersLoadOrFailCleanly) {
  Case c;
  load_case("b6_b2_partial", c);
  const Exl2Tensors good = c.tensors();
  std::mt19937 rng(4242);
  int errors = 0, loads = 0;
  for (int iter = 0; iter < 400; ++iter) {
    Owned qw(*good.q_weight), sc(*good.q_scale), sm(*good.q_scale_max), qg(*good.q_groups),
        ip(*good.q_invperm);
    Owned* parts[] = {&qw, &sc, &sm, &qg, &ip};
    Owned& p = *parts[rng() % 5];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      switch (rng() % 4) {
        case 0:  // a random byte
          p.bytes[rng() % p.bytes.size()] = static_cast<uint8_t>(rng());
          break;
        case 1:  // a small integer where integers live
          if (p.view.dtype == DType::I16)
            p.set<int16_t>(rng() % (p.bytes.size() / 2), static_cast<int16_t>(rng() % 80) - 8);
          else
            p.set<uint8_t>(rng() % p.bytes.size(), static_cast<uint8_t>(rng() % 80));
          break;
        case 2: {  // another shape, the bytes unchanged
          const size_t d = rng() % p.view.shape.size();
          p.view.shape[d] = std::max<int64_t>(1, p.view.shape[d] + static_cast<int>(rng() % 9) - 4);
          break;
        }
        default:  // truncated
          p.view.nbytes = rng() % (p.bytes.size() + 1);
      }
    }
    const Exl2Tensors t{&qw.view, &sc.view, &sm.view, &qg.view, &ip.view, nullptr};
    const int64_t out = rng() % 2 ? 8 : -1;
    const std::string msg = error_of([&] {
      exl2_dequantize("F", t, out);
      const Exl2Quantized q = exl2_quantize_layer("F", t, out);  // same checks, then packs
      EXPECT_EQ(q.single || q.mixed, q.reason.empty());
    });
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    (msg.empty() ? loads : errors)++;
  }
  EXPECT_GT(errors, 100);
  EXPECT_GT(loads, 10);
}

TEST(Exl2, BrokenModelFoldersGiveOneLineErrors) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "gyre_exl2_hostile";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"})
    fs::copy_file(kDir + "/llama/" + f, dir / f);
  fs::resize_file(dir / "model.safetensors", fs::file_size(dir / "model.safetensors") - 1000);
  expect_one_line_error([&] { load_model(dir.string()); }, "model.safetensors");
  // A float model that claims to be EXL2 has no q_weight tensors.
  fs::copy_file(kDir + "/llama_float/model.safetensors", dir / "model.safetensors",
                fs::copy_options::overwrite_existing);
  expect_one_line_error([&] { load_model(dir.string()); }, "no .q_weight");
  // The config's sizes disagree with the layers' padded widths.
  fs::copy_file(kDir + "/llama/model.safetensors", dir / "model.safetensors",
                fs::copy_options::overwrite_existing);
  auto cfg = nlohmann::json::parse(read_text_file(kDir + "/llama/config.json"));
  cfg["intermediate_size"] = 128;
  std::ofstream(dir / "config.json") << cfg.dump();
  expect_one_line_error([&] { load_model(dir.string()); }, "EXL2 layer");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gyre
