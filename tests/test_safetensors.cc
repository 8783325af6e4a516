// safetensors and HF config: the real stories260K files, and hostile headers.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"
#include "model/config.h"
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
