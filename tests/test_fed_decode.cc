// Transformer::decode_fed against the step-by-step loop it replaces (forward, then the pick through
// Backend::sample) on stories260K, greedy and sampled (top-p and top-k with a seeded draw): the
// same ids on the CPU (which has no fed steps: the loop itself) and on CUDA, where each step's
// pick feeds the next on the device and the host runs steps ahead of the ids it has taken.
// Stopping early, then going on step by step from the stop, must give the same ids as never
// stopping (the steps run past the stop wrote keys and values that the next forward passes
// overwrite).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "engine/sampler.h"
#include "engine/transformer.h"
#include "model/loader.h"

namespace gyre {
namespace {

constexpr int kMaxSeq = 160;
const std::vector<int32_t> kPrompt = {1, 403, 407, 261, 378, 9, 300, 29};

std::unique_ptr<LoadedModel> stories() {
  return load_model(std::string(GYRE_FIXTURES) + "/stories260K");
}

SamplerSettings greedy_settings() {
  SamplerSettings s;
  s.temperature = 0.0f;
  return s;
}
SamplerSettings sampled_settings(int top_k) {
  SamplerSettings s;
  s.temperature = 0.9f;
  s.top_p = 0.9f;
  s.top_k = top_k;
  s.seed = 1234;
  return s;
}

// The prompt's last logits' pick, then `steps` more, one forward pass and pick at a time.
std::vector<int> stepwise(Transformer& t, const SamplerSettings& settings, int steps) {
  Sampler sampler(settings);
  t.forward(kPrompt.data(), static_cast<int>(kPrompt.size()), 0, nullptr, false);
  std::vector<int> ids;
  for (int i = 0;; ++i) {
    const SampleRequest request = sampler.next_request();
    SampleResult r;
    t.sample_logits(&request, 1, &r);
    EXPECT_TRUE(r.error.empty()) << r.error;
    ids.push_back(r.id);
    if (i == steps) return ids;
    const int32_t id = r.id;
    t.forward(&id, 1, static_cast<int>(kPrompt.size()) + i, nullptr, false);
  }
}

// The same through decode_fed, stopping after `stop` of the `steps` ids (0: never), then going on
// step by step with the draws the fed run did not use.
std::vector<int> fed(Transformer& t, const SamplerSettings& settings, int steps, int stop) {
  Sampler sampler(settings);
  t.forward(kPrompt.data(), static_cast<int>(kPrompt.size()), 0, nullptr, false);
  std::vector<SampleRequest> requests;
  auto next = [&] {
    requests.push_back(sampler.next_request());
    return requests.back();
  };
  SampleResult first;
  const SampleRequest r0 = sampler.next_request();
  t.sample_logits(&r0, 1, &first);
  std::vector<int> ids = {first.id};
  const int pos = static_cast<int>(kPrompt.size());
  const int taken = t.decode_fed(first.id, pos, steps, next, [&](int id) {
    ids.push_back(id);
    return stop == 0 || static_cast<int>(ids.size()) <= stop;
  });
  EXPECT_EQ(taken, stop == 0 ? steps : stop) << "stop " << stop;
  EXPECT_GE(requests.size(), static_cast<size_t>(taken));
  for (int i = taken; i < steps; ++i) {
    const int32_t id = ids.back();
    t.forward(&id, 1, pos + i, nullptr, false);
    // Step i's draw: taken from the fed run's requests where it drew one ahead.
    const SampleRequest request =
        static_cast<size_t>(i) < requests.size() ? requests[static_cast<size_t>(i)] : next();
    SampleResult r;
    t.sample_logits(&request, 1, &r);
    ids.push_back(r.id);
  }
  return ids;
}

void expect_fed_matches_stepwise(Backend& backend, const SamplerSettings& settings) {
  const auto m = stories();
  Transformer t(m->config, m->weights, backend, kMaxSeq);
  const int steps = 100;
  const std::vector<int> want = stepwise(t, settings, steps);
  ASSERT_EQ(want.size(), static_cast<size_t>(steps) + 1);
  EXPECT_EQ(fed(t, settings, steps, 0), want);
  for (int stop : {1, 2, 9, 57}) EXPECT_EQ(fed(t, settings, steps, stop), want) << "stop " << stop;
  // Two fed runs back to back, the second starting where the first stopped.
  Sampler sampler(settings);
  t.forward(kPrompt.data(), static_cast<int>(kPrompt.size()), 0, nullptr, false);
  const SampleRequest r0 = sampler.next_request();
  SampleResult first;
  t.sample_logits(&r0, 1, &first);
  std::vector<int> ids = {first.id};
  std::vector<SampleRequest> drawn;
  size_t used = 0;
  auto next = [&] {  // draws in step order, the ones drawn ahead kept for the second run
    if (used == drawn.size()) drawn.push_back(sampler.next_request());
    return drawn[used++];
  };
  auto take = [&](int id) {
    ids.push_back(id);
    return true;
  };
  const int pos = static_cast<int>(kPrompt.size());
  EXPECT_EQ(t.decode_fed(ids.back(), pos, 30, next, take), 30);
  used = 30;
  EXPECT_EQ(t.decode_fed(ids.back(), pos + 30, steps - 30, next, take), steps - 30);
  EXPECT_EQ(ids, want);
}

void expect_fed_matches_stepwise(Backend& backend) {
  for (const SamplerSettings& s : {greedy_settings(), sampled_settings(0), sampled_settings(40)}) {
    SCOPED_TRACE("temperature " + std::to_string(s.temperature) + " top_k " +
                 std::to_string(s.top_k));
    expect_fed_matches_stepwise(backend, s);
  }
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
  SamplerSettings penalised;
  penalised.repetition_penalty = 1.1f;
  Sampler sampler(penalised);
  EXPECT_THROW(t.decode_fed(
                   1, 0, 3, [&] { return sampler.next_request(); }, take),
               Error);
}

TEST(FedDecodeCuda, MatchesStepwiseOnTheDevice) {
  GYRE_SKIP_WITHOUT_GPU();
#ifdef GYRE_HAVE_CUDA
  auto gpu = ctest::cuda_backend();
  const uint64_t before = cuda_fed_steps(*gpu);
  expect_fed_matches_stepwise(*gpu);
  EXPECT_GE(cuda_fed_steps(*gpu) - before, 3 * 100u) << "the fed path did not run";
#endif
}

}  // namespace
}  // namespace gyre
