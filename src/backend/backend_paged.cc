// Default batched-serving ops (a backend without them says so in one clear line) and the check
// of a step's plan that every backend runs before writing its cache.
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"

namespace gyre {

namespace {
[[noreturn]] void unsupported(const Backend& b) {
  fail("backend ", b.name(), " does not support batched serving (paged KV cache)");
}
}  // namespace

std::unique_ptr<PagedKvCache> Backend::new_paged_kv_cache(int, int, int, int, int) {
  unsupported(*this);
}

void Backend::copy_kv_page(PagedKvCache&, int, int, int) {
  unsupported(*this);
}

void Backend::attention_paged(Tensor&, const Tensor&, const Tensor&, const Tensor&, PagedKvCache&,
                              int, const PagedBatch&, const AttentionParams&) {
  unsupported(*this);
}

void Backend::rope_attention_paged(Tensor& out, Tensor& q, Tensor& k, const Tensor& v,
                                   PagedKvCache& cache, int layer, const PagedBatch& batch,
                                   const AttentionParams& p, const RopeTable& table) {
  GYRE_CHECK(batch.rows == 0 || batch.positions != nullptr, "paged attention: missing positions");
  rope_qk(q, p.n_heads, k, p.n_kv_heads, p.head_dim, batch.positions, table);
  attention_paged(out, q, k, v, cache, layer, batch, p);
}

void check_paged_heads(const AttentionParams& p, int n_kv_heads, int head_dim, int n_layers,
                       int layer) {
  GYRE_CHECK(p.n_heads > 0 && p.n_kv_heads > 0 && p.n_heads % p.n_kv_heads == 0,
             "paged attention: ", p.n_heads, " query heads cannot share ", p.n_kv_heads,
             " KV heads");
  GYRE_CHECK(p.n_kv_heads == n_kv_heads && p.head_dim == head_dim,
             "paged attention: ", p.n_kv_heads, " KV heads of ", p.head_dim,
             " do not match the cache's ", n_kv_heads, " of ", head_dim);
  GYRE_CHECK(layer >= 0 && layer < n_layers, "paged attention: layer ", layer, " out of ",
             n_layers);
}

std::vector<int32_t> check_paged_batch(const PagedBatch& b, int num_pages, int ps) {
  GYRE_CHECK(b.rows >= 0 && b.seqs >= 0 && b.max_pages >= 0, "paged attention: negative sizes");
  GYRE_CHECK(b.seqs == 0 || (b.seq_starts && b.context_lens && b.page_tables),
             "paged attention: missing batch arrays");
  GYRE_CHECK(b.rows == 0 || (b.positions && b.slots), "paged attention: missing row arrays");
  GYRE_CHECK(b.seqs > 0 || b.rows == 0, "paged attention: rows without sequences");
  GYRE_CHECK(b.padding_rows == 0 || (b.bucketed && b.padding_rows > 0 && b.padding_rows < b.rows),
             "paged attention: ", b.padding_rows, " padding rows of ", b.rows);
  const int real_rows = b.rows - b.padding_rows;
  std::vector<int32_t> row_seq(static_cast<size_t>(b.rows));
  if (b.seqs > 0)
    GYRE_CHECK(b.seq_starts[0] == 0 && b.seq_starts[b.seqs] == real_rows,
               "paged attention: sequence rows do not cover the ", real_rows, " rows");
  for (int s = 0; s < b.seqs; ++s) {
    const int r0 = b.seq_starts[s], r1 = b.seq_starts[s + 1];
    const int ctx = b.context_lens[s];
    GYRE_CHECK(r0 <= r1, "paged attention: sequence ", s, " has decreasing row bounds");
    GYRE_CHECK(ctx >= 0 && int64_t{ctx} <= int64_t{b.max_pages} * ps, "paged attention: context ",
               ctx, " of sequence ", s, " exceeds its ", b.max_pages, " pages");
    const int32_t* table = b.page_tables + static_cast<size_t>(s) * b.max_pages;
    for (int i = 0; i < (ctx + ps - 1) / ps; ++i)
      GYRE_CHECK(table[i] >= 0 && table[i] < num_pages, "paged attention: page ", table[i],
                 " of sequence ", s, " is outside the pool of ", num_pages);
    for (int r = r0; r < r1; ++r) {
      const int pos = b.positions[r];
      GYRE_CHECK(pos >= 0 && pos < ctx, "paged attention: row ", r, " at position ", pos,
                 " is outside its context of ", ctx);
      GYRE_CHECK(b.slots[r] == int64_t{table[pos / ps]} * ps + pos % ps, "paged attention: row ", r,
                 " writes slot ", b.slots[r], ", not its page table's slot for position ", pos);
      row_seq[static_cast<size_t>(r)] = s;
    }
  }
  // Padding rows: each its own sequence after the real ones (the backend gives them a scratch
  // page).
  for (int r = real_rows; r < b.rows; ++r) row_seq[static_cast<size_t>(r)] = b.seqs + r - real_rows;
  return row_seq;
}

}  // namespace gyre
