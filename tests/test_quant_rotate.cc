// The rotation folding (quant/rotate.h) against the unrotated model: the engine's forward pass
// over the rotated weights must give the original logits (F32 storage: float32 rounding only;
// F16 storage: the same next-token distributions up to a tiny KL). The random rotation itself
// is checked for orthogonality in float64.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/backend.h"
#include "engine/eval.h"
#include "engine/transformer.h"
#include "model/loader.h"
#include "quant/block_forward.h"
#include "quant/rotate.h"

namespace gyre::quant {
namespace {

const std::string kModel = std::string(GYRE_FIXTURES) + "/stories260K";

TEST(QuantRotate, RandomOrthogonalIsOrthogonal) {
  for (int n : {1, 8, 64, 96}) {
    const std::vector<double> q = random_orthogonal(n, 5);
    double worst = 0;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        double d = 0;
        for (int k = 0; k < n; ++k) d += q[i * n + k] * q[j * n + k];
        worst = std::max(worst, std::abs(d - (i == j ? 1.0 : 0.0)));
      }
    EXPECT_LT(worst, 1e-12) << n;
    EXPECT_EQ(q, random_orthogonal(n, 5));  // deterministic
    if (n > 1) {
      EXPECT_NE(q, random_orthogonal(n, 6));
    }
  }
}

std::vector<float> logits_of(const LoadedModel& m, Backend& be, const std::vector<int32_t>& ids) {
  Transformer t(m.config, m.weights, be, static_cast<int>(ids.size()));
  std::vector<float> out(ids.size() * static_cast<size_t>(m.config.vocab_size));
  t.forward(ids.data(), static_cast<int>(ids.size()), 0, out.data(), true);
  return out;
}

TEST(QuantRotate, RotatedModelGivesTheOriginalLogits) {
  auto be = backend_create("cpu", 2);
  auto base = load_model(kModel);
  const std::vector<int32_t> ids = {1,   403, 407, 261, 378, 293, 266, 360, 300, 412, 301,
                                    313, 67,  420, 288, 302, 380, 285, 331, 304, 260, 427};
  const std::vector<float> want = logits_of(*base, *be, ids);
  const int vocab = base->config.vocab_size;
  for (DType dt : {DType::F32, DType::F16}) {
    auto rot = load_model(kModel);
    rotate_model(*rot, 11, dt);
    EXPECT_FALSE(rot->config.tie_embeddings);
    EXPECT_NE(tensor_to_f32(rot->weights.get("model.layers.0.mlp.up_proj.weight")),
              tensor_to_f32(base->weights.get("model.layers.0.mlp.up_proj.weight")));
    const std::vector<float> got = logits_of(*rot, *be, ids);
    ASSERT_EQ(got.size(), want.size());
    double max_diff = 0, max_abs = 0, kl = 0;
    int top1_same = 0;
    std::vector<double> lp(vocab), lq(vocab);
    for (size_t p = 0; p < ids.size(); ++p) {
      const float* a = want.data() + p * vocab;
      const float* b = got.data() + p * vocab;
      for (int v = 0; v < vocab; ++v) {
        max_diff = std::max(max_diff, std::abs(double{a[v]} - b[v]));
        max_abs = std::max(max_abs, std::abs(double{a[v]}));
      }
      log_softmax(a, vocab, lp.data());
      log_softmax(b, vocab, lq.data());
      for (int v = 0; v < vocab; ++v) kl += std::exp(lp[v]) * (lp[v] - lq[v]);
      top1_same += std::max_element(a, a + vocab) - a == std::max_element(b, b + vocab) - b;
    }
    kl /= static_cast<double>(ids.size());
    if (dt == DType::F32) {
      EXPECT_LT(max_diff, 2e-4 * max_abs);  // float32 rounding of a few hundred products
    } else {
      EXPECT_LT(max_diff, 2e-2 * max_abs);
      EXPECT_LT(kl, 1e-4);
    }
    EXPECT_EQ(top1_same, static_cast<int>(ids.size()));
  }
}

}  // namespace
}  // namespace gyre::quant
