#include "backend/cpu/cpu_paged_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_kv_rows.h"
#include "core/error.h"

namespace gyre {

namespace {

constexpr int64_t kMinWorkPerChunk = 16 * 1024;

class CpuPagedKvCache : public PagedKvCache {
 public:
  CpuPagedKvCache(int n_layers, int n_kv_heads, int head_dim, int num_pages, int page_size,
                  KvType type)
      : n_layers(n_layers),
        n_kv_heads(n_kv_heads),
        head_dim(head_dim),
        num_pages_(num_pages),
        page_size_(page_size),
        rows(type, head_dim, checked_rows(n_layers, n_kv_heads, head_dim, num_pages, page_size)) {}
  int num_pages() const override { return num_pages_; }
  int page_size() const override { return page_size_; }
  size_t bytes() const override { return rows.bytes(); }

  // Layout: [layer][k, v][page][kv head][slot] rows: one head's keys in a page are consecutive
  // rows, and a page of one layer is one run of rows per k/v (cheap copy-on-write).
  size_t key(int layer, int page, int head, int slot) const {
    return at(layer, 0, page, head, slot);
  }
  size_t value(int layer, int page, int head, int slot) const {
    return at(layer, 1, page, head, slot);
  }

  const int n_layers, n_kv_heads, head_dim;

 private:
  static size_t checked_rows(int n_layers, int n_kv_heads, int head_dim, int num_pages,
                             int page_size) {
    GYRE_CHECK(n_layers > 0 && n_kv_heads > 0 && head_dim > 0 && num_pages > 0 && page_size > 0,
               "paged KV cache sizes must be positive, got ", n_layers, " layers, ", n_kv_heads,
               " heads of ", head_dim, ", ", num_pages, " pages of ", page_size);
    const double rows = 2.0 * n_layers * n_kv_heads * static_cast<double>(num_pages) * page_size;
    GYRE_CHECK(rows * head_dim * 4 < 1e15, "paged KV cache of ", rows * head_dim * 4,
               " bytes is too large");
    return static_cast<size_t>(rows);
  }
  size_t at(int layer, int kv, int page, int head, int slot) const {
    const size_t plane = static_cast<size_t>(layer) * 2 + static_cast<size_t>(kv);
    const size_t heads = (plane * static_cast<size_t>(num_pages_) + static_cast<size_t>(page)) *
                             static_cast<size_t>(n_kv_heads) +
                         static_cast<size_t>(head);
    return heads * static_cast<size_t>(page_size_) + static_cast<size_t>(slot);
  }
  int num_pages_, page_size_;

 public:
  CpuKvRows rows;
};

CpuPagedKvCache& cpu_cache(PagedKvCache& cache) {
  auto* c = dynamic_cast<CpuPagedKvCache*>(&cache);
  GYRE_CHECK(c != nullptr, "paged attention: the KV cache was not made by the CPU backend");
  return *c;
}

float* f32(const Tensor& t) {
  return static_cast<float*>(t.data);
}

// One query head over positions [first, last] of one KV head of a sequence, read through its
// page table. The arithmetic is that of the single-sequence attention (same order, float dot
// products, double denominator), so both give the same bits for the same keys and values.
void attend_paged(float* out, const float* q, CpuPagedKvCache& c, int layer, int kv_head,
                  const int32_t* table, int first, int last, float scale) {
  const int hd = c.head_dim, ps = c.page_size();
  const int span = last - first + 1;
  float* scores = thread_buffer(static_cast<size_t>(span)).data();
  float* row = kv_row_scratch(static_cast<size_t>(hd));
  float max_score = -INFINITY;
  for (int j = 0; j < span; ++j) {
    const int pos = first + j;
    scores[j] =
        dot_f32(q, c.rows.load(c.key(layer, table[pos / ps], kv_head, pos % ps), row), hd) * scale;
    max_score = std::max(max_score, scores[j]);
  }
  double denom = 0;
  for (int j = 0; j < span; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    denom += scores[j];
  }
  for (int d = 0; d < hd; ++d) out[d] = 0.0f;
  for (int j = 0; j < span; ++j) {
    const int pos = first + j;
    const float* v = c.rows.load(c.value(layer, table[pos / ps], kv_head, pos % ps), row);
    const float pj = scores[j];
    for (int d = 0; d < hd; ++d) out[d] += pj * v[d];
  }
  const float inv = static_cast<float>(1.0 / denom);
  for (int d = 0; d < hd; ++d) out[d] *= inv;
}

}  // namespace

std::unique_ptr<PagedKvCache> cpu_new_paged_kv_cache(int n_layers, int n_kv_heads, int head_dim,
                                                     int num_pages, int page_size, KvType type) {
  return std::make_unique<CpuPagedKvCache>(n_layers, n_kv_heads, head_dim, num_pages, page_size,
                                           type);
}

void cpu_copy_kv_page(PagedKvCache& cache, int src, int dst, int num_tokens) {
  CpuPagedKvCache& c = cpu_cache(cache);
  GYRE_CHECK(src >= 0 && src < c.num_pages() && dst >= 0 && dst < c.num_pages() && src != dst,
             "copy_kv_page: pages ", src, " -> ", dst, " are not two pages of ", c.num_pages());
  GYRE_CHECK(num_tokens >= 0 && num_tokens <= c.page_size(), "copy_kv_page: ", num_tokens,
             " tokens do not fit a page of ", c.page_size());
  for (int layer = 0; layer < c.n_layers; ++layer)
    for (int kv = 0; kv < 2; ++kv)
      for (int h = 0; h < c.n_kv_heads; ++h) {
        const size_t from = kv ? c.value(layer, src, h, 0) : c.key(layer, src, h, 0);
        const size_t to = kv ? c.value(layer, dst, h, 0) : c.key(layer, dst, h, 0);
        c.rows.copy(from, to, static_cast<size_t>(num_tokens));
      }
}

void cpu_attention_paged(ThreadPool& pool, Tensor& out, const Tensor& q, const Tensor& k,
                         const Tensor& v, PagedKvCache& cache, int layer, const PagedBatch& b,
                         const AttentionParams& p) {
  CpuPagedKvCache& c = cpu_cache(cache);
  check_paged_heads(p, c.n_kv_heads, c.head_dim, c.n_layers, layer);
  const int64_t n = b.rows, hd = p.head_dim;
  const int64_t q_cols = static_cast<int64_t>(p.n_heads) * hd;
  const int64_t kv_cols = static_cast<int64_t>(p.n_kv_heads) * hd;
  for (const Tensor* t : {static_cast<const Tensor*>(&out), &q, &k, &v})
    GYRE_CHECK(t->dtype == DType::F32 && t->rows == n, "paged attention: inputs must be F32 with ",
               n, " rows");
  GYRE_CHECK(q.cols == q_cols && out.cols == q_cols && k.cols == kv_cols && v.cols == kv_cols,
             "paged attention: q/out need ", q_cols, " columns and k/v ", kv_cols);
  GYRE_CHECK(b.padding_rows == 0, "paged attention: the CPU backend runs no padded steps");
  const std::vector<int32_t> row_seq = check_paged_batch(b, c.num_pages(), c.page_size());
  const int ps = c.page_size();

  // Every row's keys and values first: later rows of a sequence attend to earlier ones.
  for (int64_t r = 0; r < n; ++r) {
    const int page = static_cast<int>(b.slots[r] / ps), slot = static_cast<int>(b.slots[r] % ps);
    for (int h = 0; h < p.n_kv_heads; ++h) {
      c.rows.store(c.key(layer, page, h, slot), f32(k) + r * kv_cols + h * hd);
      c.rows.store(c.value(layer, page, h, slot), f32(v) + r * kv_cols + h * hd);
    }
  }

  const int group = p.n_heads / p.n_kv_heads;
  int max_ctx = 1;
  for (int s = 0; s < b.seqs; ++s) max_ctx = std::max(max_ctx, b.context_lens[s]);
  const int64_t grain = std::max<int64_t>(1, kMinWorkPerChunk / (int64_t{max_ctx} * hd * 2));
  pool.parallel_for(n * p.n_heads, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t r = task / p.n_heads;
      const int h = static_cast<int>(task % p.n_heads);
      const int s = row_seq[static_cast<size_t>(r)];
      const int pos = b.positions[r];
      const int first = p.sliding_window > 0 ? std::max(0, pos - p.sliding_window + 1) : 0;
      attend_paged(f32(out) + r * q_cols + h * hd, f32(q) + r * q_cols + h * hd, c, layer,
                   h / group, b.page_tables + static_cast<size_t>(s) * b.max_pages, first, pos,
                   p.scale);
    }
  });
}

}  // namespace gyre
