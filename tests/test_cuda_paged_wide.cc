// Batched decode steps wider than the engine tests' (40 sequences on stories260K: bucket 64, more
// decode-attention blocks than the GPU has SMs): prompts prefilled together, then decode steps
// past 64 and 128 positions (the split-count classes of the records) with the rotary embedding
// fused into the KV store. Run three ways: records on, buckets padded but eager (what a record
// replays: logits identical to the bit), and the CPU backend (the reference: within FP16
// tolerance; its greedy tokens drive every runner). Skipped when no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
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
std::unique_ptr<Backend> cuda_backend(bool record) {
  auto b = make_cuda_backend(0, BackendOptions{});
  cuda_set_decode_graphs(*b, true, record);
  return b;
}
uint64_t replays(Backend& b) {
  return cuda_graph_replays(b);
}
#else
std::unique_ptr<Backend> cuda_backend(bool) {
  return nullptr;
}
uint64_t replays(Backend&) {
  return 0;
}
#endif

constexpr int kSeqs = 40, kPageSize = 16, kMaxSeq = 192, kDecodeSteps = 140;
constexpr int kPagesPerSeq = kMaxSeq / kPageSize;

// Sequence s owns pages [s * kPagesPerSeq, (s + 1) * kPagesPerSeq).
struct Step {
  std::vector<int32_t> tokens, positions, seq_starts{0}, context_lens, tables, logit_rows;
  std::vector<int64_t> slots;
  PagedBatch batch;
};
Step make_step(const std::vector<std::vector<int32_t>>& seqs, const std::vector<int>& first,
               uint64_t generation) {
  Step st;
  for (int s = 0; s < kSeqs; ++s) {
    const auto& toks = seqs[size_t(s)];
    for (int pos = first[size_t(s)]; pos < static_cast<int>(toks.size()); ++pos) {
      st.tokens.push_back(toks[size_t(pos)]);
      st.positions.push_back(pos);
      st.slots.push_back(int64_t{s * kPagesPerSeq + pos / kPageSize} * kPageSize + pos % kPageSize);
    }
    st.logit_rows.push_back(static_cast<int32_t>(st.tokens.size()) - 1);
    st.seq_starts.push_back(static_cast<int32_t>(st.tokens.size()));
    st.context_lens.push_back(static_cast<int32_t>(toks.size()));
    for (int p = 0; p < kPagesPerSeq; ++p) st.tables.push_back(s * kPagesPerSeq + p);
  }
  PagedBatch& b = st.batch;
  b.rows = static_cast<int>(st.tokens.size());
  b.seqs = kSeqs;
  b.positions = st.positions.data();
  b.slots = st.slots.data();
  b.seq_starts = st.seq_starts.data();
  b.context_lens = st.context_lens.data();
  b.page_tables = st.tables.data();
  b.max_pages = kPagesPerSeq;
  b.generation = generation;
  return st;
}

struct Runner {
  Runner(Backend& backend, const LoadedModel& m) : t(m.config, m.weights, backend, kMaxSeq, false) {
    kv = t.new_paged_kv_cache(kSeqs * kPagesPerSeq, kPageSize);
  }
  std::vector<float> run(const Step& st) {
    std::vector<float> logits(st.logit_rows.size() * static_cast<size_t>(t.config().vocab_size));
    t.forward_batch(st.tokens.data(), st.batch, *kv, st.logit_rows.data(),
                    static_cast<int>(st.logit_rows.size()), logits.data());
    return logits;
  }
  Transformer t;
  std::unique_ptr<PagedKvCache> kv;
};

TEST(CudaPagedWide, FortyDecodeRowsReplayExactlyAndMatchTheCpu) {
  GYRE_SKIP_WITHOUT_GPU();
  auto model = load_model(std::string(GYRE_FIXTURES) + "/stories260K");
  ASSERT_GE(model->config.max_seq_len, kMaxSeq);
  const int vocab = model->config.vocab_size;
  auto rec_b = cuda_backend(true), pad_b = cuda_backend(false);
  auto cpu_b = make_cpu_backend(2);
  Runner rec(*rec_b, *model), pad(*pad_b, *model), cpu(*cpu_b, *model);

  std::mt19937 rng(5);
  std::uniform_int_distribution<int> tok(3, vocab - 1), len(1, 6);
  std::vector<std::vector<int32_t>> seqs(kSeqs);
  for (auto& s : seqs)
    for (int k = len(rng); k > 0; --k) s.push_back(tok(rng));
  std::vector<int> first(kSeqs, 0);
  float worst = 0;
  for (int k = 0; k <= kDecodeSteps; ++k) {  // step 0: the prompts; then one row per sequence
    const Step st = make_step(seqs, first, uint64_t(k) + 1);
    const std::vector<float> r = rec.run(st), p = pad.run(st), c = cpu.run(st);
    SCOPED_TRACE("step " + std::to_string(k));
    ASSERT_EQ(r.size(), p.size());
    EXPECT_EQ(std::memcmp(r.data(), p.data(), r.size() * sizeof(float)), 0)
        << "a replayed step differs from its eager run";
    float scale = 1.0f, diff = 0.0f;
    for (size_t i = 0; i < c.size(); ++i) {
      scale = std::max(scale, std::fabs(c[i]));
      diff = std::max(diff, std::fabs(r[i] - c[i]));
    }
    EXPECT_LE(diff, 0.05f * scale) << "vs the CPU backend";
    worst = std::max(worst, diff / scale);
    for (int s = 0; s < kSeqs; ++s) {
      first[size_t(s)] = static_cast<int>(seqs[size_t(s)].size());
      const float* row = c.data() + size_t(s) * static_cast<size_t>(vocab);
      seqs[size_t(s)].push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
    }
    if (::testing::Test::HasFailure()) break;
  }
  RecordProperty("worst_relative_diff", std::to_string(worst));
  // Every decode step after the bucket's first (eager) one replays a record.
  EXPECT_GE(replays(*rec_b), uint64_t{kDecodeSteps - 2});
  EXPECT_EQ(replays(*pad_b), 0u);
}

}  // namespace
}  // namespace gyre
