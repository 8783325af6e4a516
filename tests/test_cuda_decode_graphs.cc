// Batched decode steps replayed from CUDA graphs per bucket (Transformer::forward_batch, the
// CUDA backend's records): the same scripted serving steps on stories260K run four ways: records
// on, buckets padded but run eagerly (exactly what a record replays: logits must be identical to
// the bit), unpadded eager, and the CPU backend (the reference: within FP16 tolerance). The
// script changes buckets, pads rows (5 of 8, 3 of 4), has requests join and leave, crosses page
// boundaries (4-token pages) and split-count classes (64 keys) while records replay. Skipped when
// no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "engine/transformer.h"
#include "model/loader.h"
#ifdef GYRE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

#include "cuda_test_util.h"

namespace gyre {
namespace {

#ifdef GYRE_HAVE_CUDA
// buckets/record as in cuda_set_decode_graphs; neither: the plain eager path.
std::unique_ptr<Backend> cuda_backend(bool buckets, bool record) {
  auto b = make_cuda_backend(0, BackendOptions{});
  cuda_set_decode_graphs(*b, buckets, record);
  return b;
}
uint64_t replays(Backend& b) {
  return cuda_graph_replays(b);
}
#else
std::unique_ptr<Backend> cuda_backend(bool, bool) {
  return nullptr;
}
uint64_t replays(Backend&) {
  return 0;
}
#endif

std::string fixture(const std::string& rel) {
  return std::string(GYRE_FIXTURES) + "/" + rel;
}

constexpr int kPageSize = 4;
constexpr int kPages = 96;
constexpr int kMaxSeq = 96;

// One sequence of the script: its tokens so far and its pages (the same ids on every runner).
struct Seq {
  std::vector<int32_t> tokens;
  int done = 0;  // positions whose keys and values are stored
  std::vector<int32_t> pages;
};

// Pages handed out and taken back in order, so every runner sees the same ids (reused ones too).
struct PagePool {
  std::vector<int32_t> free_pages;
  PagePool() {
    for (int p = kPages - 1; p >= 0; --p) free_pages.push_back(p);
  }
  void grow(Seq& s, int context) {
    while (static_cast<int>(s.pages.size()) * kPageSize < context) {
      EXPECT_FALSE(free_pages.empty());
      s.pages.push_back(free_pages.back());
      free_pages.pop_back();
    }
  }
  void release(Seq& s) {
    for (auto it = s.pages.rbegin(); it != s.pages.rend(); ++it) free_pages.push_back(*it);
    s.pages.clear();
  }
};

// A step's flat batch: (sequence, new tokens) in row order; logits of each one's last row.
struct Step {
  std::vector<int32_t> tokens, positions, seq_starts{0}, context_lens, tables, logit_rows;
  std::vector<int64_t> slots;
  int max_pages = 0;
  PagedBatch batch;
};
Step make_step(std::vector<Seq>& seqs, const std::vector<std::pair<int, int>>& plan, PagePool& pool,
               uint64_t generation) {
  Step st;
  for (const auto& [id, n] : plan) {
    Seq& s = seqs[static_cast<size_t>(id)];
    pool.grow(s, s.done + n);
    st.max_pages = std::max(st.max_pages, static_cast<int>(s.pages.size()));
  }
  for (const auto& [id, n] : plan) {
    Seq& s = seqs[static_cast<size_t>(id)];
    for (int i = 0; i < n; ++i) {
      const int pos = s.done + i;
      st.tokens.push_back(s.tokens[static_cast<size_t>(pos)]);
      st.positions.push_back(pos);
      st.slots.push_back(int64_t{s.pages[static_cast<size_t>(pos / kPageSize)]} * kPageSize +
                         pos % kPageSize);
    }
    st.logit_rows.push_back(static_cast<int32_t>(st.tokens.size()) - 1);
    st.seq_starts.push_back(static_cast<int32_t>(st.tokens.size()));
    st.context_lens.push_back(s.done + n);
    for (int p = 0; p < st.max_pages; ++p)
      st.tables.push_back(p < static_cast<int>(s.pages.size()) ? s.pages[static_cast<size_t>(p)]
                                                               : -1);
  }
  PagedBatch& b = st.batch;
  b.rows = static_cast<int>(st.tokens.size());
  b.seqs = static_cast<int>(plan.size());
  b.positions = st.positions.data();
  b.slots = st.slots.data();
  b.seq_starts = st.seq_starts.data();
  b.context_lens = st.context_lens.data();
  b.page_tables = st.tables.data();
  b.max_pages = st.max_pages;
  b.generation = generation;
  return st;
}

// One backend with its own model copy and paged caches.
struct Runner {
  Runner(Backend& backend, const LoadedModel& m, int caches)
      : t(m.config, m.weights, backend, kMaxSeq, false) {
    for (int i = 0; i < caches; ++i) kv.push_back(t.new_paged_kv_cache(kPages, kPageSize));
  }
  std::vector<float> run(const Step& st, int cache = 0) {
    std::vector<float> logits(st.logit_rows.size() * static_cast<size_t>(t.config().vocab_size));
    t.forward_batch(st.tokens.data(), st.batch, *kv[static_cast<size_t>(cache)],
                    st.logit_rows.data(), static_cast<int>(st.logit_rows.size()), logits.data());
    return logits;
  }
  Transformer t;
  std::vector<std::unique_ptr<PagedKvCache>> kv;
};

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}
float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}
int argmax(const float* v, int n) {
  return static_cast<int>(std::max_element(v, v + n) - v);
}

TEST(CudaDecodeGraphs, BucketedStepsMatchEagerExactlyAndTheCpu) {
  GYRE_SKIP_WITHOUT_GPU();
  auto model = load_model(fixture("stories260K"));
  const int vocab = model->config.vocab_size;
  auto rec_b = cuda_backend(true, true), pad_b = cuda_backend(true, false),
       plain_b = cuda_backend(false, false);
  auto cpu_b = make_cpu_backend(2);
  Runner rec(*rec_b, *model, 1), pad(*pad_b, *model, 1), plain(*plain_b, *model, 1),
      cpu(*cpu_b, *model, 1);

  std::mt19937 rng(11);
  std::uniform_int_distribution<int> tok(3, vocab - 1);
  const int prompt_lens[] = {6, 3, 5, 2, 4};
  std::vector<Seq> seqs(5);
  for (size_t i = 0; i < seqs.size(); ++i)
    for (int k = 0; k < prompt_lens[i]; ++k) seqs[i].tokens.push_back(tok(rng));

  // The script: each step lists (sequence, new tokens); decodes first, then prefill chunks.
  using Plan = std::vector<std::pair<int, int>>;
  std::vector<Plan> script;
  auto repeat = [&](const Plan& p, int times) {
    for (int i = 0; i < times; ++i) script.push_back(p);
  };
  script.push_back({{0, 6}});
  repeat({{0, 1}}, 3);                                         // bucket 1
  script.push_back({{0, 1}, {1, 3}});                          // mixed: eager
  repeat({{0, 1}, {1, 1}}, 3);                                 // bucket 2
  script.push_back({{0, 1}, {1, 1}, {2, 5}});                  // mixed
  repeat({{0, 1}, {1, 1}, {2, 1}}, 3);                         // 3 rows of bucket 4
  script.push_back({{0, 1}, {1, 1}, {2, 1}, {3, 2}, {4, 4}});  // two join
  repeat({{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}}, 5);         // 5 rows of bucket 8
  repeat({{0, 1}, {2, 1}, {3, 1}, {4, 1}}, 3);                 // 1 leaves: bucket 4
  repeat({{3, 1}, {4, 1}}, 45);  // 0, 2 leave: bucket 2; spans pass 64 (a new split class)
  repeat({{4, 1}}, 12);          // bucket 1 again, past 64 positions
  // The step after which each sequence leaves (its pages go back to the pool, reused later).
  const std::vector<int> leave_after = {20, 17, 20, 65, 77};

  PagePool pool;
  int decode_steps = 0;
  for (size_t k = 0; k < script.size(); ++k) {
    const Plan& plan = script[k];
    bool decode = true;
    for (const auto& [id, n] : plan) decode = decode && n == 1;
    decode_steps += decode;
    Step st = make_step(seqs, plan, pool, k + 1);
    const std::vector<float> r = rec.run(st), p = pad.run(st), e = plain.run(st), c = cpu.run(st);
    SCOPED_TRACE("step " + std::to_string(k) + " rows " + std::to_string(st.batch.rows));
    ASSERT_EQ(r.size(), p.size());
    EXPECT_EQ(std::memcmp(r.data(), p.data(), r.size() * sizeof(float)), 0)
        << "a replayed step differs from its eager run (max diff " << max_diff(r, p) << ")";
    const float tol = 0.05f * std::max(1.0f, max_abs(c));
    EXPECT_LE(max_diff(r, c), tol) << "vs the CPU backend";
    EXPECT_LE(max_diff(e, c), tol) << "unpadded eager vs the CPU backend";
    EXPECT_LE(max_diff(r, e), tol) << "vs unpadded eager";
    for (size_t i = 0; i < plan.size(); ++i) {
      Seq& s = seqs[static_cast<size_t>(plan[i].first)];
      s.done += plan[i].second;
      // Greedy continuation from the CPU reference (the same tokens for every runner).
      const int next = argmax(c.data() + i * static_cast<size_t>(vocab), vocab);
      if (s.done == static_cast<int>(s.tokens.size())) s.tokens.push_back(next);
    }
    for (size_t i = 0; i < seqs.size(); ++i)
      if (static_cast<int>(k) == leave_after[i]) pool.release(seqs[i]);
  }
  EXPECT_GE(decode_steps, 25);
  // Every bucket's first step runs eagerly, its second is recorded (and replayed), the rest
  // replay; a record dropped because a buffer grew is made again at the bucket's next step
  // (a recording that needs a buffer to grow first runs eagerly instead). Buckets: 1, 2, 4, 8.
  EXPECT_GE(replays(*rec_b), static_cast<uint64_t>(decode_steps - 12));
  EXPECT_EQ(replays(*pad_b), 0u);
  EXPECT_EQ(replays(*plain_b), 0u);
}

// A record writes the keys and values of the cache it was recorded with: a step on another
// cache of the same bucket must not replay it.
TEST(CudaDecodeGraphs, AlternatingCachesNeverReplayTheOtherCachesRecord) {
  GYRE_SKIP_WITHOUT_GPU();
  auto model = load_model(fixture("stories260K"));
  const int vocab = model->config.vocab_size;
  auto rec_b = cuda_backend(true, true), pad_b = cuda_backend(true, false);
  Runner rec(*rec_b, *model, 2), pad(*pad_b, *model, 2);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> tok(3, vocab - 1);
  // Cache c holds sequences 2c and 2c + 1 (their own page pools: the caches are separate).
  std::vector<Seq> seqs(4);
  for (Seq& s : seqs)
    for (int k = 0; k < 5; ++k) s.tokens.push_back(tok(rng));
  PagePool pools[2];
  uint64_t gen = 1;
  for (int c = 0; c < 2; ++c) {
    Step st = make_step(seqs, {{2 * c, 5}, {2 * c + 1, 5}}, pools[c], gen++);
    EXPECT_EQ(rec.run(st, c), pad.run(st, c));
    for (int i : {2 * c, 2 * c + 1}) seqs[static_cast<size_t>(i)].done = 5;
  }
  for (int k = 0; k < 12; ++k) {
    const int c = k % 2;
    for (int i : {2 * c, 2 * c + 1}) seqs[static_cast<size_t>(i)].tokens.push_back(tok(rng));
    Step st = make_step(seqs, {{2 * c, 1}, {2 * c + 1, 1}}, pools[c], gen++);
    const std::vector<float> r = rec.run(st, c), p = pad.run(st, c);
    EXPECT_EQ(std::memcmp(r.data(), p.data(), r.size() * sizeof(float)), 0)
        << "step " << k << " on cache " << c << ": max diff " << max_diff(r, p);
    for (int i : {2 * c, 2 * c + 1}) seqs[static_cast<size_t>(i)].done++;
  }
}

}  // namespace
}  // namespace gyre
