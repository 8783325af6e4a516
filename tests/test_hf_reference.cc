// The forward pass against Hugging Face transformers (float32) on tiny random-weight models of
// every architecture variant (tests/data/hf_tiny, made by tools/make_hf_reference.py).
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "engine/transformer.h"
#include "hf_reference_util.h"

namespace gyre {
namespace {

class HfReference : public ::testing::TestWithParam<std::string> {};

TEST_P(HfReference, CpuLogitsMatchTransformers) {
  auto m = testing::load_hf_tiny(GetParam());
  auto backend = backend_create("cpu", 2);
  const int n = static_cast<int>(m->input_ids.size());
  const int vocab = m->config.vocab_size;
  {  // the whole sequence in one pass
    Transformer t(m->config, m->weights, *backend, 64);
    std::vector<float> logits(static_cast<size_t>(n) * vocab);
    t.forward(m->input_ids.data(), n, 0, logits.data(), true);
    for (int i = 0; i < n; ++i)
      EXPECT_LT(testing::rel_max_error(&logits[static_cast<size_t>(i) * vocab], m->logits[i]), 2e-5)
          << GetParam() << " position " << i;
  }
  // Dynamic NTK rescales every position by the current length, so a one-shot pass and an
  // incremental one legitimately differ (transformers behaves the same way).
  if (m->config.rope.scaling == RopeScaling::DynamicNtk) return;
  {  // a prompt, then one token at a time through the KV cache
    Transformer t(m->config, m->weights, *backend, 64);
    std::vector<float> logits(static_cast<size_t>(vocab));
    const int prompt = 5;
    t.forward(m->input_ids.data(), prompt, 0, logits.data(), false);
    EXPECT_LT(testing::rel_max_error(logits.data(), m->logits[prompt - 1]), 2e-5);
    for (int i = prompt; i < n; ++i) {
      t.forward(&m->input_ids[static_cast<size_t>(i)], 1, i, logits.data(), false);
      EXPECT_LT(testing::rel_max_error(logits.data(), m->logits[i]), 2e-5)
          << GetParam() << " decode position " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, HfReference,
                         ::testing::ValuesIn(testing::hf_tiny_variants()));

}  // namespace
}  // namespace gyre
