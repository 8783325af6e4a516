// The CPU backend's paged attention over a ragged batch against two oracles: a naive float64
// causal attention written here, and the existing single-sequence attention (KvCache), on random
// data with awkward sizes, GQA, sliding windows and pages scattered over the pool.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend_test_util.h"
#include "core/error.h"

namespace gyre {
namespace {

using btest::host;

constexpr int kHeads = 6, kKvHeads = 2, kHeadDim = 12, kPageSize = 5, kPages = 64, kLayers = 2;

std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

Tensor activation(Backend& b, int64_t rows, int64_t cols, const float* values) {
  Tensor t = b.alloc(rows, cols);
  std::memcpy(t.data, values, static_cast<size_t>(rows * cols) * sizeof(float));
  return t;
}

AttentionParams params(int window) {
  AttentionParams p;
  p.n_heads = kHeads;
  p.n_kv_heads = kKvHeads;
  p.head_dim = kHeadDim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  p.sliding_window = window;
  return p;
}

// One sequence's whole history: q, k, v for positions 0..len-1 of one layer.
struct SeqData {
  int len = 0;
  std::vector<float> q, k, v;
  std::vector<int32_t> pages;  // its page table
};

// Naive float64 causal attention of position `pos` (all heads) over positions [first, pos].
std::vector<double> reference_row(const SeqData& s, int pos, int window) {
  const int q_cols = kHeads * kHeadDim, kv_cols = kKvHeads * kHeadDim;
  std::vector<double> out(static_cast<size_t>(q_cols));
  const int first = window > 0 ? std::max(0, pos - window + 1) : 0;
  for (int h = 0; h < kHeads; ++h) {
    const int kh = h / (kHeads / kKvHeads);
    std::vector<double> w;
    for (int j = first; j <= pos; ++j) {
      double dot = 0;
      for (int d = 0; d < kHeadDim; ++d)
        dot += double(s.q[size_t(pos * q_cols + h * kHeadDim + d)]) *
               s.k[size_t(j * kv_cols + kh * kHeadDim + d)];
      w.push_back(dot / std::sqrt(double(kHeadDim)));
    }
    const double mx = *std::max_element(w.begin(), w.end());
    double z = 0;
    for (double& x : w) z += (x = std::exp(x - mx));
    for (int j = first; j <= pos; ++j)
      for (int d = 0; d < kHeadDim; ++d)
        out[size_t(h * kHeadDim + d)] +=
            w[size_t(j - first)] / z * s.v[size_t(j * kv_cols + kh * kHeadDim + d)];
  }
  return out;
}

// Rows [from[s], to[s]) of every sequence as one ragged batch, through attention_paged.
std::vector<float> run_paged(Backend& be, PagedKvCache& kv, int layer,
                             const std::vector<SeqData>& seqs, const std::vector<int>& from,
                             const std::vector<int>& to, int window) {
  const int q_cols = kHeads * kHeadDim, kv_cols = kKvHeads * kHeadDim;
  std::vector<float> q, k, v;
  std::vector<int32_t> positions, starts = {0}, ctx, tables;
  std::vector<int64_t> slots;
  int max_pages = 0;
  for (const SeqData& s : seqs) max_pages = std::max(max_pages, int(s.pages.size()));
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqData& s = seqs[i];
    for (int p = from[i]; p < to[i]; ++p) {
      q.insert(q.end(), s.q.begin() + p * q_cols, s.q.begin() + (p + 1) * q_cols);
      k.insert(k.end(), s.k.begin() + p * kv_cols, s.k.begin() + (p + 1) * kv_cols);
      v.insert(v.end(), s.v.begin() + p * kv_cols, s.v.begin() + (p + 1) * kv_cols);
      positions.push_back(p);
      slots.push_back(int64_t(s.pages[size_t(p / kPageSize)]) * kPageSize + p % kPageSize);
    }
    starts.push_back(int32_t(positions.size()));
    ctx.push_back(to[i]);
    std::vector<int32_t> row = s.pages;
    row.resize(size_t(max_pages), -1);
    tables.insert(tables.end(), row.begin(), row.end());
  }
  const int rows = int(positions.size());
  PagedBatch b;
  b.rows = rows;
  b.seqs = int(seqs.size());
  b.positions = positions.data();
  b.slots = slots.data();
  b.seq_starts = starts.data();
  b.context_lens = ctx.data();
  b.page_tables = tables.data();
  b.max_pages = max_pages;
  Tensor tq = activation(be, rows, q_cols, q.data()), tk = activation(be, rows, kv_cols, k.data()),
         tv = activation(be, rows, kv_cols, v.data()), out = be.alloc(rows, q_cols);
  be.attention_paged(out, tq, tk, tv, kv, layer, b, params(window));
  return host(be, out);
}

// Sequences of awkward lengths with their pages drawn at random from the whole pool.
std::vector<SeqData> make_seqs(const std::vector<int>& lens, std::mt19937& rng) {
  std::vector<int32_t> pool(kPages);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  size_t next = 0;
  std::vector<SeqData> seqs;
  for (int len : lens) {
    SeqData s;
    s.len = len;
    s.q = random_floats(size_t(len * kHeads * kHeadDim), rng);
    s.k = random_floats(size_t(len * kKvHeads * kHeadDim), rng);
    s.v = random_floats(size_t(len * kKvHeads * kHeadDim), rng);
    for (int p = 0; p < (len + kPageSize - 1) / kPageSize; ++p) s.pages.push_back(pool[next++]);
    seqs.push_back(std::move(s));
  }
  return seqs;
}

TEST(CpuPagedAttention, RaggedBatchMatchesFloat64AndSingleSequence) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(5);
  const std::vector<int> lens = {1, 7, 13, 26, 3, 11};
  for (int window : {0, 4}) {
    const std::vector<SeqData> seqs = make_seqs(lens, rng);
    auto kv = be->new_paged_kv_cache(kLayers, kKvHeads, kHeadDim, kPages, kPageSize);
    // Step 1 prefills a ragged prefix of each sequence, step 2 the rest (several rows for some,
    // one for others): the second step reads keys the first one wrote, across pages.
    std::vector<int> zero(lens.size(), 0), mid, end = lens;
    for (int len : lens) mid.push_back(len == 1 ? 0 : len - 1 - len / 3);
    const int layer = 1;
    std::vector<float> got = run_paged(*be, *kv, layer, seqs, zero, mid, window);
    std::vector<float> got2 = run_paged(*be, *kv, layer, seqs, mid, end, window);
    got.clear();
    // Both steps' rows against both oracles.
    size_t row = 0;
    const int q_cols = kHeads * kHeadDim, kv_cols = kKvHeads * kHeadDim;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const SeqData& s = seqs[i];
      auto single = be->new_kv_cache(kLayers, kKvHeads, kHeadDim, s.len);
      Tensor tq = activation(*be, s.len, q_cols, s.q.data()),
             tk = activation(*be, s.len, kv_cols, s.k.data()),
             tv = activation(*be, s.len, kv_cols, s.v.data()), out = be->alloc(s.len, q_cols);
      be->attention(out, tq, tk, tv, *single, layer, 0, params(window));
      const std::vector<float> want_single = host(*be, out);
      for (int p = mid[i]; p < s.len; ++p, ++row) {
        const std::vector<double> want = reference_row(s, p, window);
        for (int c = 0; c < q_cols; ++c) {
          const float g = got2[row * size_t(q_cols) + size_t(c)];
          ASSERT_NEAR(g, want[size_t(c)], 1e-5) << "seq " << i << " pos " << p << " col " << c;
          ASSERT_NEAR(g, want_single[size_t(p * q_cols + c)], 1e-6);
        }
      }
    }
    EXPECT_EQ(row, got2.size() / size_t(q_cols));
  }
}

TEST(CpuPagedAttention, CopiedPageServesAFork) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(9);
  std::vector<SeqData> seqs = make_seqs({8}, rng);
  auto kv = be->new_paged_kv_cache(kLayers, kKvHeads, kHeadDim, kPages, kPageSize);
  const std::vector<float> first = run_paged(*be, *kv, 0, seqs, {0}, {8}, 0);
  // A fork shares page 0 and copies the 3 written slots of the partial page 1 (copy-on-write).
  SeqData fork = seqs[0];
  const int32_t fresh = fork.pages[1] == 0 ? 1 : 0;
  be->copy_kv_page(*kv, fork.pages[1], fresh, 3);
  fork.pages[1] = fresh;
  // Re-running the last position through the fork reads pages 0 and the copy.
  const std::vector<float> again = run_paged(*be, *kv, 0, {fork}, {7}, {8}, 0);
  const int q_cols = kHeads * kHeadDim;
  for (int c = 0; c < q_cols; ++c) EXPECT_EQ(again[size_t(c)], first[size_t(7 * q_cols + c)]);
  EXPECT_THROW(be->copy_kv_page(*kv, 0, kPages, 1), Error);
  EXPECT_THROW(be->copy_kv_page(*kv, 0, 1, kPageSize + 1), Error);
}

TEST(CpuPagedAttention, RejectsBadPlans) {
  auto be = make_cpu_backend(1);
  std::mt19937 rng(3);
  std::vector<SeqData> seqs = make_seqs({6}, rng);
  auto kv = be->new_paged_kv_cache(kLayers, kKvHeads, kHeadDim, kPages, kPageSize);
  seqs[0].pages[1] = kPages;  // outside the pool
  EXPECT_THROW(run_paged(*be, *kv, 0, seqs, {0}, {6}, 0), Error);
  seqs[0].pages[1] = -1;
  EXPECT_THROW(run_paged(*be, *kv, 0, seqs, {0}, {6}, 0), Error);
  seqs[0].pages[1] = 2;
  EXPECT_THROW(run_paged(*be, *kv, kLayers, seqs, {0}, {6}, 0), Error);
  EXPECT_NO_THROW(run_paged(*be, *kv, 0, seqs, {0}, {6}, 0));
  EXPECT_THROW(be->new_paged_kv_cache(kLayers, kKvHeads, kHeadDim, 0, kPageSize), Error);
}

}  // namespace
}  // namespace gyre
