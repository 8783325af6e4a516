// Scheduler end to end against a fake model whose next token is a hash of the whole context it
// reads back through the plan's page table from a simulated KV memory. The oracle for every
// request is a plain sequential generation loop over its own token list: any scheduling or
// paging mistake (lost chunk, wrong position, wrong page, missing copy, bad prefix hit) changes
// the generated tokens. Each step is also checked for budget, batch size and that no decoding
// sequence is skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <set>

#include "core/error.h"
#include "engine/scheduler.h"

namespace gyre {
namespace {

constexpr int kVocab = 64;
constexpr int32_t kEos = 0;

int32_t fake_next_token(const std::vector<int32_t>& context) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : context) h = (h ^ uint32_t(t)) * 1099511628211ull;
  return int32_t((h >> 17) % kVocab);
}

// The reference: what a one-request-at-a-time generator produces.
std::vector<int32_t> reference_output(const Request& r) {
  std::vector<int32_t> context = r.prompt, out;
  while (true) {
    const int32_t t = fake_next_token(context);
    out.push_back(t);
    const bool stop =
        std::find(r.stop_tokens.begin(), r.stop_tokens.end(), t) != r.stop_tokens.end();
    if (stop || int(out.size()) == r.max_tokens) return out;
    context.push_back(t);
  }
}

struct Driver {
  Driver(const SchedulerConfig& config, int num_pages, int page_size)
      : kv(num_pages, page_size),
        sched(config, kv),
        slots(size_t(num_pages) * page_size, -1),
        page_size(page_size) {}

  void add(Request r) {
    truth[r.id] = r.prompt;
    expected[r.id] = reference_output(r);
    requests[r.id] = r;
    sched.add_request(std::move(r));
  }

  // One scheduler step with every plan property checked; `between` runs after the fake
  // backend executed the plan and before commit (to cancel in-flight sequences).
  BatchPlan step(const std::function<void()>& between = {}) {
    std::vector<SeqId> decoding;
    for (const auto& [id, t] : truth) {
      const Sequence& s = sched.sequence(id);
      if (s.state == SeqState::kRunning && s.pending() == 1) decoding.push_back(id);
    }
    BatchPlan plan = sched.schedule();
    const SchedulerConfig& cfg = sched.config();
    EXPECT_LE(plan.num_tokens, cfg.max_step_tokens);
    EXPECT_LE(int(plan.seqs.size()), cfg.max_batch);
    std::set<SeqId> in_plan;
    int tokens = 0;
    for (const SeqStep& st : plan.seqs) {
      EXPECT_TRUE(in_plan.insert(st.id).second) << "sequence twice in one step";
      tokens += int(st.tokens.size());
    }
    EXPECT_EQ(tokens, plan.num_tokens);
    // Decodes are never stalled by prefill: each one runs unless it was preempted.
    for (SeqId id : decoding) {
      const bool preempted =
          std::find(plan.preempted.begin(), plan.preempted.end(), id) != plan.preempted.end();
      EXPECT_TRUE(in_plan.count(id) || preempted) << "decode of " << id << " skipped";
    }
    for (PageCopy c : plan.copies)
      for (int i = 0; i < c.num_tokens; ++i)
        slots[size_t(c.dst) * page_size + i] = slots[size_t(c.src) * page_size + i];
    size_t logit_seqs = 0;
    for (const SeqStep& st : plan.seqs) {
      const auto& t = truth.at(st.id);
      const int n = int(st.tokens.size());
      EXPECT_GT(n, 0);
      EXPECT_EQ(int(st.page_table.size()), (st.context_len + page_size - 1) / page_size);
      for (int i = 0; i < n; ++i) {
        EXPECT_EQ(st.positions[i], st.context_len - n + i);
        EXPECT_EQ(st.tokens[i], t.at(st.positions[i])) << "wrong token for " << st.id;
        computed[st.id][st.positions[i]]++;
        first_step.emplace(st.id, steps);
      }
      EXPECT_EQ(st.need_logits, st.context_len == int(t.size()));
      logit_seqs += st.need_logits;
    }
    // The fake backend sees only the flat arrays, as a batched kernel would: write every row's
    // KV slot, then attend through each sequence's padded page-table row.
    const FlatBatch flat = flatten(plan, page_size);
    EXPECT_EQ(int(flat.tokens.size()), plan.num_tokens);
    for (size_t r = 0; r < flat.tokens.size(); ++r) {
      EXPECT_EQ(flat.slots[r] % page_size, flat.positions[r] % page_size);
      slots.at(flat.slots[r]) = flat.tokens[r];
    }
    std::vector<StepResult> results;
    size_t seq = 0;
    for (int32_t row : flat.logit_rows) {
      while (flat.seq_starts[seq + 1] <= row) ++seq;
      EXPECT_EQ(row, flat.seq_starts[seq + 1] - 1) << "logits of a row that is not the last";
      const SeqStep& st = plan.seqs[seq];
      std::vector<int32_t> context;
      for (int p = 0; p < flat.context_lens[seq]; ++p) {
        const int32_t page = flat.page_tables[seq * flat.max_pages + p / page_size];
        context.push_back(slots.at(size_t(page) * page_size + p % page_size));
      }
      const auto& t = truth.at(st.id);
      EXPECT_EQ(context, std::vector<int32_t>(t.begin(), t.begin() + st.context_len))
          << "sequence " << st.id << " reads wrong KV";
      results.push_back({st.id, fake_next_token(context)});
    }
    EXPECT_EQ(results.size(), logit_seqs);
    if (between) between();
    for (const SeqUpdate& u : sched.commit(plan, results)) {
      truth[u.id].push_back(u.token);
      if (u.finished) finish_order.push_back(u.id);
    }
    steps++;
    return plan;
  }

  // Every page reference belongs to a live sequence's page table, and vice versa.
  void check_pages() {
    std::vector<int> refs(kv.num_pages(), 0);
    for (SeqId id : kv.sequences()) {
      const SeqState st = sched.sequence(id).state;
      EXPECT_TRUE(st == SeqState::kRunning) << "pages held by a non-running sequence " << id;
      for (PageId p : kv.page_table(id)) refs[p]++;
    }
    for (PageId p = 0; p < kv.num_pages(); ++p) EXPECT_EQ(kv.refcount(p), refs[p]);
  }

  void run_to_completion(int max_steps) {
    while (sched.has_unfinished()) {
      ASSERT_LT(steps, max_steps) << "scheduler stalled";
      step();
      if (testing::Test::HasFailure()) return;
    }
  }

  void check_outputs() {
    for (const auto& [id, r] : requests) {
      const Sequence& s = sched.sequence(id);
      if (s.state == SeqState::kCancelled) continue;
      ASSERT_EQ(s.state, SeqState::kFinished) << id;
      EXPECT_EQ(s.output(), expected.at(id)) << "request " << id;
      EXPECT_EQ(s.finish_reason, s.output().back() == kEos && !r.stop_tokens.empty()
                                     ? SeqFinish::kStop
                                     : SeqFinish::kLength);
    }
    EXPECT_EQ(kv.stats().used_pages, 0);
  }

  KvPageManager kv;
  Scheduler sched;
  std::vector<int32_t> slots;
  int page_size;
  int steps = 0;
  std::map<SeqId, Request> requests;
  std::map<SeqId, std::vector<int32_t>> truth;     // prompt + committed tokens
  std::map<SeqId, std::vector<int32_t>> expected;  // reference outputs
  std::map<SeqId, std::map<int, int>> computed;    // times each position's KV was computed
  std::vector<SeqId> finish_order;
  std::map<SeqId, int> first_step;  // step in which each sequence first ran
};

Request make_request(SeqId id, std::vector<int32_t> prompt, int max_tokens, int priority = 0) {
  Request r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.priority = priority;
  r.stop_tokens = {kEos};
  return r;
}

std::vector<int32_t> random_tokens(std::mt19937& rng, int n) {
  std::vector<int32_t> v(n);
  for (auto& t : v) t = std::uniform_int_distribution<int>(1, kVocab - 1)(rng);
  return v;
}

TEST(Scheduler, SingleRequestMatchesSequentialGeneration) {
  Driver d({.max_step_tokens = 16, .max_batch = 4}, 32, 4);
  std::mt19937 rng(1);
  Request r = make_request(1, random_tokens(rng, 50), 20);
  r.stop_tokens.clear();  // run to max_tokens
  d.add(r);
  d.run_to_completion(100);
  d.check_outputs();
  EXPECT_EQ(d.sched.sequence(1).num_generated(), 20);
  EXPECT_EQ(d.sched.sequence(1).finish_reason, SeqFinish::kLength);
  // 50 prompt tokens at 16 per step: 4 prefill steps (the last yields the first token), then
  // one step per further token.
  EXPECT_EQ(d.steps, 4 + 19);
}

TEST(Scheduler, LongPromptIsChunkedAndNeverStallsDecodes) {
  Driver d({.max_step_tokens = 64, .max_batch = 8}, 256, 16);
  std::mt19937 rng(2);
  for (SeqId id = 1; id <= 4; ++id) {
    Request r = make_request(id, random_tokens(rng, 10), 60);
    r.stop_tokens.clear();
    d.add(r);
  }
  d.step();  // all four prefill in one step
  d.add(make_request(9, random_tokens(rng, 1000), 5));
  int long_prefill_steps = 0;
  while (d.sched.sequence(9).num_generated() == 0) {
    const BatchPlan plan = d.step();
    ASSERT_EQ(plan.seqs.size(), 5u);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(plan.seqs[i].tokens.size(), 1u);  // decodes first
    EXPECT_EQ(plan.seqs[4].id, 9);
    EXPECT_EQ(plan.num_tokens, plan.seqs[4].need_logits ? 4 + 1000 % 60 : 64);
    long_prefill_steps++;
  }
  EXPECT_EQ(long_prefill_steps, (1000 + 59) / 60);
  d.run_to_completion(1000);
  d.check_outputs();
}

TEST(Scheduler, SharedPrefixIsPrefilledOnce) {
  Driver d({.max_step_tokens = 128, .max_batch = 8}, 128, 16);
  std::mt19937 rng(3);
  const std::vector<int32_t> system = random_tokens(rng, 256);
  auto with_suffix = [&](int n) {
    auto p = system;
    auto s = random_tokens(rng, n);
    p.insert(p.end(), s.begin(), s.end());
    return p;
  };
  d.add(make_request(1, with_suffix(5), 8));
  while (d.sched.sequence(1).num_generated() == 0) d.step();
  for (SeqId id = 2; id <= 6; ++id) d.add(make_request(id, with_suffix(int(id) * 7), 8));
  d.run_to_completion(1000);
  d.check_outputs();
  for (int pos = 0; pos < 256; ++pos) {
    int times = 0;
    for (const auto& [id, c] : d.computed) times += c.count(pos) ? c.at(pos) : 0;
    ASSERT_EQ(times, 1) << "prefix position " << pos;
  }
  EXPECT_EQ(d.sched.stats().cached_prompt_tokens, 5 * 256);
  EXPECT_GT(d.kv.stats().hit_rate(), 0.5);
}

TEST(Scheduler, PreemptsNewestUnderMemoryPressureAndRecomputes) {
  // 12 pages of 4 tokens: two requests of 10 + 30 tokens cannot both fit.
  Driver d({.max_step_tokens = 32, .max_batch = 4}, 12, 4);
  std::mt19937 rng(4);
  for (SeqId id = 1; id <= 2; ++id) {
    Request r = make_request(id, random_tokens(rng, 10), 30);
    r.stop_tokens.clear();
    d.add(r);
  }
  d.run_to_completion(500);
  d.check_outputs();
  EXPECT_EQ(d.finish_order, (std::vector<SeqId>{1, 2}));
  EXPECT_EQ(d.sched.sequence(1).num_preemptions, 0);
  EXPECT_GT(d.sched.sequence(2).num_preemptions, 0);
  EXPECT_GT(d.sched.stats().preemptions, 0);
}

TEST(Scheduler, HigherPriorityRunsFirst) {
  Driver d({.max_step_tokens = 8, .max_batch = 1}, 16, 4);
  std::mt19937 rng(5);
  d.add(make_request(1, random_tokens(rng, 5), 3, 0));
  d.add(make_request(2, random_tokens(rng, 5), 3, 0));
  d.add(make_request(3, random_tokens(rng, 5), 3, 7));
  d.run_to_completion(100);
  d.check_outputs();
  EXPECT_EQ(d.finish_order, (std::vector<SeqId>{3, 1, 2}));
}

TEST(Scheduler, CancellationReleasesPagesAnytime) {
  Driver d({.max_step_tokens = 8, .max_batch = 4}, 64, 4);
  std::mt19937 rng(6);
  for (SeqId id = 1; id <= 4; ++id) {
    Request r = make_request(id, random_tokens(rng, 20), 10);
    r.stop_tokens.clear();
    d.add(r);
  }
  EXPECT_TRUE(d.sched.cancel(4));  // still waiting
  d.step();                        // 1 prefills
  d.step();
  EXPECT_TRUE(d.kv.contains(1));
  EXPECT_TRUE(d.sched.cancel(1));  // running, not in flight
  EXPECT_FALSE(d.kv.contains(1));
  d.check_pages();
  // In flight: pages survive until the step commits, its token is dropped.
  d.step([&] {
    EXPECT_TRUE(d.sched.cancel(2));
    EXPECT_TRUE(d.kv.contains(2));
  });
  EXPECT_FALSE(d.kv.contains(2));
  EXPECT_FALSE(d.sched.cancel(2));
  EXPECT_FALSE(d.sched.cancel(99));
  d.run_to_completion(200);
  d.check_outputs();
  EXPECT_FALSE(d.sched.cancel(3));  // finished
  EXPECT_EQ(d.sched.stats().cancelled, 3);
  d.sched.erase(3);
  EXPECT_THROW(d.sched.sequence(3), Error);
}

TEST(Scheduler, RejectsBadRequestsAndMismatchedCommits) {
  KvPageManager kv(4, 4);
  Scheduler s({.max_step_tokens = 8, .max_batch = 2, .max_seq_len = 20}, kv);
  EXPECT_THROW(s.add_request(make_request(1, {}, 3)), Error);
  EXPECT_THROW(s.add_request(make_request(1, {1, 2}, 0)), Error);
  EXPECT_THROW(s.add_request(make_request(1, {1, -2}, 3)), Error);
  EXPECT_THROW(s.add_request(make_request(1, std::vector<int32_t>(18, 1), 3)), Error);  // > 20
  EXPECT_THROW(s.add_request(make_request(1, std::vector<int32_t>(15, 1), 3)), Error);  // > pool
  s.add_request(make_request(1, {1, 2, 3}, 2));
  EXPECT_THROW(s.add_request(make_request(1, {4}, 2)), Error);  // duplicate id
  EXPECT_THROW(Scheduler({.max_step_tokens = 4, .max_batch = 8}, kv), Error);

  const BatchPlan plan = s.schedule();
  ASSERT_EQ(plan.seqs.size(), 1u);
  EXPECT_THROW(s.schedule(), Error);
  EXPECT_THROW(s.commit(plan, {}), Error);  // missing token
  const StepResult two[] = {{1, 5}, {1, 6}};
  EXPECT_THROW(s.commit(plan, two), Error);
  const StepResult stranger[] = {{1, 5}, {7, 6}};
  EXPECT_THROW(s.commit(plan, stranger), Error);
  BatchPlan altered = plan;
  altered.seqs[0].tokens[0] = 9;
  const StepResult ok[] = {{1, 5}};
  EXPECT_THROW(s.commit(altered, ok), Error);
  // The failed commits changed nothing: the real one still applies.
  const auto updates = s.commit(plan, ok);
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_EQ(s.sequence(1).tokens, (std::vector<int32_t>{1, 2, 3, 5}));
  EXPECT_THROW(s.commit(plan, ok), Error);  // twice
  EXPECT_THROW(s.erase(1), Error);          // still running
}

// Hundreds of requests with shared system prompts joining over time, random cancellations
// (some in flight) and a KV pool small enough to force preemption.
void random_run(uint32_t seed, bool priorities) {
  Driver d({.max_step_tokens = 96, .max_batch = 12}, 80, 8);
  std::mt19937 rng(seed);
  auto rand_int = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<std::vector<int32_t>> systems;
  for (int i = 0; i < 3; ++i) systems.push_back(random_tokens(rng, rand_int(8, 120)));
  SeqId next_id = 1;
  const int num_requests = 300;
  std::vector<SeqId> active;
  while (next_id <= num_requests || d.sched.has_unfinished()) {
    ASSERT_LT(d.steps, 20000) << "scheduler stalled";
    for (int k = rand_int(0, 2); k > 0 && next_id <= num_requests; --k) {
      auto prompt = rand_int(0, 3) ? systems[rand_int(0, 2)] : std::vector<int32_t>{};
      auto suffix = random_tokens(rng, rand_int(1, 150));
      prompt.insert(prompt.end(), suffix.begin(), suffix.end());
      d.add(make_request(next_id, prompt, rand_int(1, 30), priorities ? rand_int(0, 2) : 0));
      active.push_back(next_id++);
    }
    std::erase_if(active, [&](SeqId id) {
      const SeqState s = d.sched.sequence(id).state;
      return s == SeqState::kFinished || s == SeqState::kCancelled;
    });
    std::function<void()> between;
    if (!active.empty() && rand_int(0, 19) == 0) {
      const SeqId victim = active[rand_int(0, int(active.size()) - 1)];
      if (rand_int(0, 1)) {
        EXPECT_TRUE(d.sched.cancel(victim));
      } else {
        between = [&d, victim] { EXPECT_TRUE(d.sched.cancel(victim)); };
      }
    }
    d.step(between);
    d.check_pages();
    if (testing::Test::HasFailure()) return;
  }
  d.check_outputs();
  const SchedulerStats& st = d.sched.stats();
  EXPECT_EQ(st.finished + st.cancelled, num_requests);
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GT(st.cached_prompt_tokens, 0);
  EXPECT_GT(st.cancelled, 0);
  EXPECT_GT(d.kv.stats().deduplicated_pages, 0);
  if (!priorities) {
    // First come, first served: ids grow with arrival, so first runs must not go backwards.
    int last = -1;
    for (const auto& [id, step] : d.first_step) {
      EXPECT_GE(step, last) << "request " << id << " overtaken by a later one";
      last = step;
    }
  }
}

TEST(Scheduler, RandomWorkloadsFinishCorrectly) {
  for (uint32_t seed = 1; seed <= 2; ++seed) random_run(seed, false);
  random_run(11, true);
}

TEST(Scheduler, BigRequestIsNotStarvedByAStreamOfSmallOnes) {
  // The big request needs 37 of the 40 pages; small ones (3 pages each) arrive every step, more
  // than the pool can serve, so there is always a small request that would fit before it.
  Driver d({.max_step_tokens = 32, .max_batch = 8}, 40, 8);
  std::mt19937 rng(7);
  Request big = make_request(1, random_tokens(rng, 250), 40);
  big.stop_tokens.clear();
  SeqId next_id = 100;
  int big_done_at = -1;
  for (int step = 0; step < 300 && big_done_at < 0; ++step) {
    if (step == 5) d.add(big);
    d.add(make_request(next_id++, random_tokens(rng, 12), 6));
    d.step();
    if (step >= 5 && d.sched.sequence(1).state == SeqState::kFinished) big_done_at = step;
    if (testing::Test::HasFailure()) return;
  }
  ASSERT_GE(big_done_at, 0) << "the 250-token request starved";
  EXPECT_GT(d.sched.num_waiting(), 10);  // the stream really was more than could be served
  EXPECT_EQ(d.sched.sequence(1).output(), d.expected.at(1));
}

}  // namespace
}  // namespace gyre
