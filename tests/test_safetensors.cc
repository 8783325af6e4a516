// safetensors and HF config: the real stories260K files, and hostile headers.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"
#include "error_test_util.h"
#include "model/config.h"
#include "model/loader.h"
#include "model/safetensors.h"

namespace gyre {
namespace {

const std::string kStories = std::string(GYRE_FIXTURES) + "/stories260K";

std::vector<uint8_t> make_file(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> f(8 + header.size() + data_bytes, 0);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) f[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(f.data() + 8, header.data(), header.size());
  return f;
}

TEST(Safetensors, LoadsStories260K) {
  WeightSet w;
  safetensors_load(kStories + "/model.safetensors", w);
  const TensorView& e = w.get("model.embed_tokens.weight", {512, 64});
  EXPECT_EQ(e.dtype, DType::F32);
  EXPECT_EQ(e.nbytes, 512u * 64 * 4);
  const nlohmann::json cfg = nlohmann::json::parse(read_text_file(kStories + "/config.json"));
  const ModelConfig c = config_from_hf_json(cfg, nullptr);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_TRUE(c.tie_embeddings);
  weights_validate(w, c);
}

TEST(Safetensors, RejectsHostileHeaders) {
  const std::vector<std::pair<std::string, size_t>> bad = {
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 8},  // past the end
      {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8},   // size mismatch
      {R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,8]}})", 8},  // negative dim
      {R"({"a":{"dtype":"Q9","shape":[2],"data_offsets":[0,8]}})", 8},    // unknown dtype
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8},   // reversed
      {R"({"a":{"dtype":"F32","shape":[2]}})", 8},                        // no offsets
      {R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8},
      {R"({"a":)", 8},  // bad JSON
      {R"([1,2])", 8},  // not an object
  };
  for (const auto& [header, n] : bad) {
    WeightSet w;
    auto f = make_file(header, n);
    EXPECT_THROW(safetensors_parse(f.data(), f.size(), "t", w), Error) << header;
  }
  auto f = make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8);
  f[0] = 0xff;  // header length beyond the file
  WeightSet w;
  EXPECT_THROW(safetensors_parse(f.data(), f.size(), "t", w), Error);
  WeightSet ok;
  auto g = make_file(R"({"a":{"dtype":"F16","shape":[2,2],"data_offsets":[0,8]}})", 8);
  safetensors_parse(g.data(), g.size(), "t", ok);
  EXPECT_EQ(ok.get("a").shape, (std::vector<int64_t>{2, 2}));
}

TEST(Config, UnknownArchitectureIsNamed) {
  nlohmann::json j = {{"architectures", {"GPTNeoXForCausalLM"}}, {"vocab_size", 10}};
  try {
    config_from_hf_json(j, nullptr);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("GPTNeoXForCausalLM"), std::string::npos);
  }
}

TEST(Config, Llama3RopeScalingMatchesFormula) {
  RopeConfig r;
  r.theta = 500000.0f;
  r.rot_dim = 128;
  r.scaling = RopeScaling::Llama3;
  r.factor = 8.0f;
  r.low_freq_factor = 1.0f;
  r.high_freq_factor = 4.0f;
  r.original_max_pos = 8192;
  const auto inv = rope_inv_freq(r, 131072, 0);
  // Highest frequency untouched, lowest divided by the factor.
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
  EXPECT_NEAR(inv[63], 1.0 / std::pow(500000.0, 126.0 / 128) / 8.0, 1e-12);
}

// A sharded folder whose model.safetensors.index.json is broken or hostile gets one line naming
// what is wrong; the intact index over the same shard loads (the control).
TEST(Safetensors, HostileShardIndexesGiveOneLineErrors) {
  namespace fs = std::filesystem;
  const std::string d = ::testing::TempDir() + "/gyre_hostile_index";
  fs::remove_all(d);
  fs::create_directories(d);
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json"})
    if (fs::exists(kStories + "/" + f)) fs::copy_file(kStories + "/" + f, d + "/" + f);
  fs::copy_file(kStories + "/model.safetensors", d + "/a.safetensors");
  WeightSet w;
  safetensors_load(kStories + "/model.safetensors", w);
  auto index_with = [&](const std::function<std::string(const std::string&)>& file_of) {
    nlohmann::json map = nlohmann::json::object();
    for (const auto& [name, t] : w.all()) map[name] = file_of(name);
    return nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", map}}.dump();
  };
  auto with_index = [&](const std::string& text) {
    std::ofstream(d + "/model.safetensors.index.json", std::ios::trunc) << text;
    return [&] { load_model(d); };
  };
  with_index(index_with([](const std::string&) { return "a.safetensors"; }))();  // control
  using testutil::expect_one_line_error;
  expect_one_line_error(with_index("{\"weight_map\": "), "index.json");
  expect_one_line_error(with_index("{\"weight_map\": []}"), "no weight_map object");
  expect_one_line_error(with_index("{\"weight_map\": {}}"), "names no shards");
  expect_one_line_error(with_index("{\"weight_map\": {\"x\": 5}}"), "not a string");
  expect_one_line_error(
      with_index(index_with([](const std::string&) { return "../a.safetensors"; })),
      "not a plain file name");
  expect_one_line_error(
      with_index(index_with([](const std::string&) { return "missing.safetensors"; })),
      "missing.safetensors");
  // Two shards that both hold every tensor: a duplicate, not a silent choice of one.
  fs::copy_file(kStories + "/model.safetensors", d + "/b.safetensors");
  bool first = true;
  expect_one_line_error(with_index(index_with([&](const std::string&) {
                          first = !first;
                          return first ? "a.safetensors" : "b.safetensors";
                        })),
                        "appears twice");
}

}  // namespace
}  // namespace gyre

namespace gyre {
namespace {

TEST(Config, GgufFrequencyFactorsDivideEachPair) {
  RopeConfig r;
  r.theta = 500000.0f;
  r.rot_dim = 8;
  r.freq_factors = {1.0f, 2.0f, 4.0f, 8.0f};
  const auto inv = rope_inv_freq(r, 1024, 0);
  for (int i = 0; i < 4; ++i)
    EXPECT_NEAR(inv[static_cast<size_t>(i)], 1.0 / std::pow(500000.0, 2.0 * i / 8) / (1 << i),
                1e-9);
  EXPECT_EQ(rope_attention_factor(r, 1024), 1.0f);
}

}  // namespace
}  // namespace gyre
