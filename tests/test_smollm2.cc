// SmolLM2-135M-Instruct (GGUF Q4_1, a real instruct model) against Hugging Face transformers:
// transformers' own tokenization, its float32 logits and its greedy continuation, recorded in
// tests/data/smollm2_hf_reference.json by tools/make_hf_reference.py from the same GGUF file.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/mapped_file.h"
#include "engine/transformer.h"
#include "model/loader.h"
#include "tokenizer/chat_template.h"

namespace gyre {
namespace {

const std::string kModel = std::string(GYRE_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

nlohmann::json reference() {
  return nlohmann::json::parse(
      read_text_file(std::string(GYRE_SOURCE_DIR) + "/tests/data/smollm2_hf_reference.json"));
}

class SmolLM2 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (file_exists(kModel)) model_ = load_model(kModel).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (model_ == nullptr) GTEST_SKIP() << "no " << kModel << " (run scripts/fetch_models.sh)";
  }
  static LoadedModel* model_;
};
LoadedModel* SmolLM2::model_ = nullptr;

TEST_F(SmolLM2, TokenizerMatchesTransformers) {
  const auto ref = reference();
  for (const auto& c : ref["cases"]) {
    const std::string text = c["text"];
    if (text == "<chat>") continue;
    EXPECT_EQ(model_->tokenizer->encode(text, true), c["input_ids"].get<std::vector<int>>())
        << text;
  }
}

TEST_F(SmolLM2, ChatTemplateRendersTransformersIds) {
  const auto ref = reference();
  const auto& c = ref["cases"][2];
  ASSERT_EQ(c["text"], "<chat>");
  ASSERT_FALSE(model_->chat_template.empty());
  const std::string rendered =
      render_chat_template(model_->chat_template, ref["chat_messages"], true, "", "");
  EXPECT_EQ(model_->tokenizer->encode(rendered, false), c["input_ids"].get<std::vector<int>>());
}

TEST_F(SmolLM2, LogitsAndGreedyMatchTransformers) {
  const auto ref = reference();
  auto backend = backend_create("cpu", 0);
  for (const auto& c : ref["cases"]) {
    Transformer t(model_->config, model_->weights, *backend, 128);
    const auto ids = c["input_ids"].get<std::vector<int32_t>>();
    const int n = static_cast<int>(ids.size());
    const int vocab = model_->config.vocab_size;
    std::vector<float> logits(static_cast<size_t>(n) * vocab);
    t.forward(ids.data(), n, 0, logits.data(), true);
    for (int i = 0; i < n; ++i) {
      const float* row = &logits[static_cast<size_t>(i) * vocab];
      const auto top_ids = c["top20_ids"][i].get<std::vector<int>>();
      const auto top_logits = c["top20_logits"][i].get<std::vector<float>>();
      EXPECT_EQ(std::max_element(row, row + vocab) - row, top_ids[0]) << "position " << i;
      for (size_t k = 0; k < top_ids.size(); ++k)
        EXPECT_NEAR(row[top_ids[k]], top_logits[k], 2e-3 * std::max(1.0f, std::abs(top_logits[k])))
            << "position " << i << " rank " << k;
    }
    // Greedy continuation, token by token through the KV cache.
    const auto want = c["greedy_ids"].get<std::vector<int>>();
    std::vector<int> got;
    int next = static_cast<int>(std::max_element(&logits[static_cast<size_t>(n - 1) * vocab],
                                                 &logits[static_cast<size_t>(n) * vocab]) -
                                &logits[static_cast<size_t>(n - 1) * vocab]);
    std::vector<float> row(static_cast<size_t>(vocab));
    for (size_t s = 0; s < want.size(); ++s) {
      got.push_back(next);
      if (s + 1 == want.size()) break;
      int32_t tok = next;
      t.forward(&tok, 1, n + static_cast<int>(s), row.data(), false);
      next = static_cast<int>(std::max_element(row.begin(), row.end()) - row.begin());
    }
    EXPECT_EQ(got, want) << c["text"];
  }
}

}  // namespace
}  // namespace gyre
