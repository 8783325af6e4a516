// Transformer::decode_greedy against the step-by-step loop it replaces (forward, then the greedy
// pick through Backend::sample) on stories260K: the same ids on the CPU (which has no fed steps:
// the loop itself) and on CUDA, where each step's pick feeds the next on the device and the host
// runs steps ahead of the ids it has taken. Stopping early, then going on step by step from the
// stop, must give the same ids as never stopping (the steps run past the stop wrote keys and
// values that the next forward passes overwrite).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "engine/transformer.h"
#include "model/loader.h"

namespace gyre {
namespace {

constexpr int kMaxSeq = 160;
const std::vector<int32_t> kPrompt = {1, 403, 407, 261, 378, 9, 300, 29};

std::unique_ptr<LoadedModel> stories() {
  return load_model(std::string(GYRE_FIXTURES) + "/stories260K");
}

// The prompt's last logits' greedy pick, then `steps` more, one forward pass and pick at a time.
std::vector<int> stepwise(Transformer& t, int steps) {
  t.forward(kPrompt.data(), static_cast<int>(kPrompt.size()), 0, nullptr, false);
  const SampleRequest greedy;
  std::vector<int> ids;
  for (int i = 0;; ++i) {
    SampleResult r;
    t.sample_logits(&greedy, 1, &r);
    EXPECT_TRUE(r.error.empty()) << r.error;
    ids.push_back(r.id);
    if (i == steps) return ids;
    const int32_t id = r.id;
    t.forward(&id, 1, static_cast<int>(kPrompt.size()) + i, nullptr, false);
  }
}

// The same through decode_greedy, stopping after `stop` of the `steps` ids (0: never), then going
// on step by step.
std::vector<int> fed(Transformer& t, int steps, int stop) {
  t.forward(kPrompt.data(), static_cast<int>(kPrompt.size()), 0, nullptr, false);
  const SampleRequest greedy;
  SampleResult first;
  t.sample_logits(&greedy, 1, &first);
  std::vector<int> ids = {first.id};
  const int pos = static_cast<int>(kPrompt.size());
  const int taken = t.decode_greedy(first.id, pos, steps, [&](int id) {
    ids.push_back(id);
    return stop == 0 || static_cast<int>(ids.size()) <= stop;
  });
  EXPECT_EQ(taken, stop == 0 ? steps : stop) << "stop " << stop;
  for (int i = taken; i < steps; ++i) {
    const int32_t id = ids.back();
    t.forward(&id, 1, pos + i, nullptr, false);
    SampleResult r;
    t.sample_logits(&greedy, 1, &r);
    ids.push_back(r.id);
  }
  return ids;
}

void expect_fed_matches_stepwise(Backend& backend) {
  const auto m = stories();
  Transformer t(m->config, m->weights, backend, kMaxSeq);
  const int steps = 100;
  const std::vector<int> want = stepwise(t, steps);
  ASSERT_EQ(want.size(), static_cast<size_t>(steps) + 1);
  EXPECT_EQ(fed(t, steps, 0), want);
  for (int stop : {1, 2, 9, 57}) EXPECT_EQ(fed(t, steps, stop), want) << "stop " << stop;
  // Two fed runs back to back, the second starting where the first stopped.
  t.forward(kPrompt.data(), static_cast<int>(kPrompt.size()), 0, nullptr, false);
  std::vector<int> ids = {want[0]};
  auto take = [&](int id) {
    ids.push_back(id);
    return true;
  };
  const int pos = static_cast<int>(kPrompt.size());
  EXPECT_EQ(t.decode_greedy(ids.back(), pos, 30, take), 30);
  EXPECT_EQ(t.decode_greedy(ids.back(), pos + 30, steps - 30, take), steps - 30);
  EXPECT_EQ(ids, want);
}

TEST(FedDecode, CpuLoopMatchesStepwise) {
  auto cpu = make_cpu_backend(2);
  expect_fed_matches_stepwise(*cpu);
}

TEST(FedDecode, RefusesBadArguments) {
  const auto m = stories();
  auto cpu = make_cpu_backend(1);
  Transformer t(m->config, m->weights, *cpu, 32);
  auto take = [](int) { return true; };
  EXPECT_THROW(t.decode_greedy(1, 30, 3, take), Error);  // past the context
  EXPECT_THROW(t.decode_greedy(-1, 0, 3, take), Error);
  EXPECT_THROW(t.decode_greedy(m->config.vocab_size, 0, 3, take), Error);
  EXPECT_EQ(t.decode_greedy(1, 0, 0, take), 0);
}

TEST(FedDecodeCuda, MatchesStepwiseOnTheDevice) {
  GYRE_SKIP_WITHOUT_GPU();
#ifdef GYRE_HAVE_CUDA
  auto gpu = ctest::cuda_backend();
  const uint64_t before = cuda_fed_steps(*gpu);
  expect_fed_matches_stepwise(*gpu);
  EXPECT_GE(cuda_fed_steps(*gpu) - before, 100u) << "the fed path did not run";
#endif
}

}  // namespace
}  // namespace gyre
