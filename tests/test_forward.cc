// The whole forward pass on the CPU backend against llama2.c's run.c (the stories260K golden
// file): greedy decoding must reproduce its tokens exactly and its logits to 1e-4.
// The model is built from config.json + model.safetensors directly, without the tokenizer.
#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "engine/transformer.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace gyre {
namespace {

const std::string kDir = std::string(GYRE_FIXTURES) + "/stories260K";

struct Stories {
  ModelConfig config;
  WeightSet weights;
  nlohmann::json golden;
};

const Stories& stories() {
  static const Stories* s = [] {
    auto* st = new Stories;
    st->config =
        config_from_hf_json(nlohmann::json::parse(read_text_file(kDir + "/config.json")), nullptr);
    safetensors_load(kDir + "/model.safetensors", st->weights);
    st->golden = nlohmann::json::parse(read_text_file(kDir + "/golden.json"));
    return st;
  }();
  return *s;
}

// Ties go to the lowest id, as run.c's argmax does.
int argmax(const std::vector<float>& logits) {
  int best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int>(i);
  return best;
}

TEST(ForwardStories260K, GreedyDecodeMatchesLlama2c) {
  const Stories& s = stories();
  auto backend = make_cpu_backend(2);
  const int vocab = s.config.vocab_size;
  double decode_seconds = 0;
  int decoded = 0;
  for (const auto& c : s.golden.at("cases")) {
    const std::vector<int32_t> prompt = c.at("prompt_ids").get<std::vector<int32_t>>();
    const std::vector<int32_t> expected = c.at("generated_ids").get<std::vector<int32_t>>();
    const int total = static_cast<int>(prompt.size() + expected.size());
    ASSERT_EQ(total, 201);
    Transformer model(s.config, s.weights, *backend, total);

    std::vector<float> logits(static_cast<size_t>(vocab));
    std::vector<std::vector<float>> first_logits;
    model.forward(prompt.data(), static_cast<int>(prompt.size()), 0, logits.data(), false);
    std::vector<int32_t> generated;
    int pos = static_cast<int>(prompt.size());
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      if (first_logits.size() < 3) first_logits.push_back(logits);
      const int32_t next = argmax(logits);
      generated.push_back(next);
      if (pos + 1 == total) break;  // the last sampled token is never fed back
      model.forward(&next, 1, pos++, logits.data(), false);
      ++decoded;
    }
    decode_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(generated, expected) << "prompt: " << c.at("prompt");

    for (const auto& entry : c.at("top5_logits_first3")) {
      const size_t index = entry.at("generated_index").get<size_t>();
      ASSERT_LT(index, first_logits.size());
      for (const auto& top : entry.at("top5")) {
        const int id = top.at("id").get<int>();
        EXPECT_NEAR(first_logits[index][static_cast<size_t>(id)], top.at("logit").get<double>(),
                    1e-4)
            << "prompt: " << c.at("prompt") << ", position " << index << ", id " << id;
      }
    }
  }
  std::printf("[ info ] stories260K CPU decode (%s): %.0f tokens/s over %d tokens\n",
              backend->name().c_str(), decoded / decode_seconds, decoded);
}

TEST(ForwardStories260K, PrefillEqualsTokenByToken) {
  const Stories& s = stories();
  const auto& c = s.golden.at("cases").at(1);
  std::vector<int32_t> tokens = c.at("prompt_ids").get<std::vector<int32_t>>();
  for (int32_t t : c.at("generated_ids")) tokens.push_back(t);
  tokens.resize(60);
  const int n = static_cast<int>(tokens.size()), vocab = s.config.vocab_size;

  auto backend = make_cpu_backend(3);
  Transformer whole(s.config, s.weights, *backend, n);
  std::vector<float> all(static_cast<size_t>(n * vocab));
  whole.forward(tokens.data(), n, 0, all.data(), true);

  // Token by token, then in uneven chunks (17 + 1 + 42), on fresh caches.
  Transformer stepwise(s.config, s.weights, *backend, n);
  std::vector<float> row(static_cast<size_t>(vocab));
  for (int i = 0; i < n; ++i) {
    stepwise.forward(&tokens[static_cast<size_t>(i)], 1, i, row.data(), false);
    for (int v = 0; v < vocab; ++v)
      ASSERT_NEAR(row[static_cast<size_t>(v)], all[static_cast<size_t>(i * vocab + v)], 1e-5)
          << "position " << i << " id " << v;
  }
  Transformer chunked(s.config, s.weights, *backend, n);
  std::vector<float> part(static_cast<size_t>(42 * vocab));
  chunked.forward(tokens.data(), 17, 0, part.data(), false);
  chunked.forward(tokens.data() + 17, 1, 17, part.data(), false);
  chunked.forward(tokens.data() + 18, 42, 18, part.data(), true);
  for (int i = 0; i < 42 * vocab; ++i)
    ASSERT_NEAR(part[static_cast<size_t>(i)], all[static_cast<size_t>(18 * vocab + i)], 1e-5);

  // Past the context: a clean error, not a crash.
  EXPECT_THROW(chunked.forward(tokens.data(), 1, n, row.data(), false), Error);
  EXPECT_THROW(chunked.forward(tokens.data(), 2, INT32_MAX, row.data(), false), Error);
  const int32_t bad_token = s.config.vocab_size;
  EXPECT_THROW(chunked.forward(&bad_token, 1, 0, row.data(), false), Error);
}

// Tiny random models of each family variant (dynamic NTK, linear and Llama 3 RoPE scaling,
// Mistral's sliding window, Qwen2's q/k/v biases) against Hugging Face transformers' float32
// logits for every position of a 24-token input (tests/data/hf_tiny, tools/make_hf_reference.py).
TEST(ForwardHfTiny, EveryVariantMatchesTransformers) {
  auto backend = make_cpu_backend(2);
  for (const char* variant : {"llama2_dynamic_ntk", "llama2_linear_rope", "llama3_gqa_ropescaled",
                              "mistral_sliding_window", "qwen2_bias"}) {
    const std::string dir = std::string(GYRE_SOURCE_DIR) + "/tests/data/hf_tiny/" + variant;
    const nlohmann::json generation =
        nlohmann::json::parse(read_text_file(dir + "/generation_config.json"));
    const ModelConfig config = config_from_hf_json(
        nlohmann::json::parse(read_text_file(dir + "/config.json")), &generation);
    WeightSet weights;
    safetensors_load(dir + "/model.safetensors", weights);
    const nlohmann::json ref = nlohmann::json::parse(read_text_file(dir + "/reference.json"));
    const std::vector<int32_t> ids = ref.at("input_ids").get<std::vector<int32_t>>();
    const auto want = ref.at("logits").get<std::vector<std::vector<double>>>();
    const int n = static_cast<int>(ids.size()), vocab = config.vocab_size;

    Transformer model(config, weights, *backend, n);
    std::vector<float> got(static_cast<size_t>(n * vocab));
    model.forward(ids.data(), n, 0, got.data(), true);
    for (int i = 0; i < n; ++i)
      for (int v = 0; v < vocab; ++v)
        ASSERT_NEAR(got[static_cast<size_t>(i * vocab + v)], want[i][v], 1e-4)
            << variant << " position " << i << " id " << v;

    // Token by token gives the same, except under dynamic NTK, whose frequencies depend on the
    // length of the sequence so far (as in transformers with a cache).
    if (config.rope.scaling == RopeScaling::DynamicNtk) continue;
    Transformer stepwise(config, weights, *backend, n);
    std::vector<float> row(static_cast<size_t>(vocab));
    for (int i = 0; i < n; ++i) {
      stepwise.forward(&ids[static_cast<size_t>(i)], 1, i, row.data(), false);
      for (int v = 0; v < vocab; ++v)
        ASSERT_NEAR(row[static_cast<size_t>(v)], want[i][v], 1e-4)
            << variant << " step " << i << " id " << v;
    }
  }
}

}  // namespace
}  // namespace gyre
