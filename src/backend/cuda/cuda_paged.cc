// The CUDA backend's batched-serving ops: the paged KV cache, page copies (copy-on-write of a
// shared prefix), and attention_paged (rope_attention_paged: the rotation of q and k fused with
// the cache store, paged_rope_store.cu). A step's PagedBatch is checked and uploaded once (one
// pinned copy of every array, at the first layer of a new generation); the other layers reuse it.
// Rows are routed here: prefill chunks of >= kTileMinRows consecutive positions go to the
// tensor-core tile kernel (where the head dim has one), every other row to the split kernel.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_buffers.h"
#include "backend/cuda/paged_attention.h"

namespace gyre::cuda {

namespace {

// Below this many rows a sequence's rows keep more blocks busy in the split kernel (the
// single-sequence path switches at the same count).
constexpr int kTileMinRows = 16;

class CudaPagedKvCache final : public PagedKvCache {
 public:
  CudaPagedKvCache(int n_layers, int n_kv_heads, int head_dim, int num_pages, int page_size,
                   KvType type)
      : n_layers(n_layers),
        n_kv_heads(n_kv_heads),
        head_dim(head_dim),
        type(type),
        num_pages_(num_pages),
        page_size_(page_size) {
    GYRE_CHECK(n_layers > 0 && n_kv_heads > 0 && head_dim > 0 && num_pages > 0 && page_size > 0,
               "paged KV cache sizes must be positive, got ", n_layers, " layers, ", n_kv_heads,
               " heads of ", head_dim, ", ", num_pages, " pages of ", page_size);
    const double rows = 2.0 * n_layers * n_kv_heads * static_cast<double>(page_size) * num_pages;
    GYRE_CHECK(rows * static_cast<double>(kv_row_bytes(type, head_dim)) < 1e15,
               "paged KV cache of ", rows, " rows is too large");
    page_rows_ = static_cast<size_t>(n_kv_heads) * static_cast<size_t>(page_size);
    // One page more than asked for: the scratch page of bucketed steps' padding rows.
    const size_t plane_rows = page_rows_ * (static_cast<size_t>(num_pages) + 1);
    code_plane_ = plane_rows * kv_code_bytes(type, head_dim);
    param_plane_ = plane_rows * kv_param_halves(type, head_dim) * sizeof(half);
    const size_t planes = 2 * static_cast<size_t>(n_layers);
    bytes_ = planes * (code_plane_ + param_plane_);
    const std::string what = "the paged KV cache (" + std::to_string(num_pages) + " pages of " +
                             std::to_string(page_size) + " tokens, " + kv_type_name(type) + ")";
    codes_ = device_alloc(planes * code_plane_, what);
    if (param_plane_ > 0) params_ = device_alloc(planes * param_plane_, what);
  }
  int num_pages() const override { return num_pages_; }
  int page_size() const override { return page_size_; }
  size_t bytes() const override { return bytes_; }
  // Layer `layer`'s keys (kv 0) or values (kv 1): codes rows [page][kv_head][slot] (FP16: the
  // halves) and params rows likewise (null for FP16); row format core/kv_quant.h.
  void* codes(int layer, int kv) const {
    return static_cast<uint8_t*>(codes_.get()) +
           (2 * static_cast<size_t>(layer) + kv) * code_plane_;
  }
  half* params(int layer, int kv) const {
    if (!params_) return nullptr;
    return reinterpret_cast<half*>(static_cast<uint8_t*>(params_.get()) +
                                   (2 * static_cast<size_t>(layer) + kv) * param_plane_);
  }
  size_t page_rows() const { return page_rows_; }  // rows of one page of one plane
  int scratch_page() const { return num_pages_; }  // never in a caller's page table

  const int n_layers, n_kv_heads, head_dim;
  const KvType type;

 private:
  int num_pages_, page_size_;
  size_t page_rows_ = 0, bytes_ = 0;
  size_t code_plane_ = 0, param_plane_ = 0;  // bytes of one layer's keys (or values)
  std::shared_ptr<void> codes_, params_;
};

// GYRE_CUDA_PAGED_SPLITS=N (1..64) in the environment fixes the split count of the paged decode
// attention (for comparisons with the heuristic of attention_splits); 0: the heuristic.
int forced_paged_splits() {
  static const int forced = [] {
    const char* v = std::getenv("GYRE_CUDA_PAGED_SPLITS");
    const int n = v && *v ? std::atoi(v) : 0;
    return n >= 1 && n <= 64 ? n : 0;
  }();
  return forced;
}

CudaPagedKvCache& cuda_cache(PagedKvCache& cache) {
  auto* c = dynamic_cast<CudaPagedKvCache*>(&cache);
  GYRE_CHECK(c != nullptr, "paged attention: the KV cache was not made by the CUDA backend");
  return *c;
}

}  // namespace

// The device copy of one step's batch: one allocation, one pinned copy per generation.
struct PagedStep {
  PagedStep() { GYRE_CUDA_CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming)); }
  ~PagedStep() { (void)cudaEventDestroy(copied); }
  PagedStep(const PagedStep&) = delete;
  PagedStep& operator=(const PagedStep&) = delete;

  bool valid = false;
  uint64_t generation = 0;
  const PagedKvCache* cache = nullptr;
  int rows = 0, seqs = 0, max_pages = 0;
  std::shared_ptr<void> pinned, device;
  size_t capacity = 0;
  cudaEvent_t copied = nullptr;  // the last copy out of `pinned`
  const int64_t* slots = nullptr;
  const int32_t *positions = nullptr, *row_seq = nullptr, *page_tables = nullptr;
  const int32_t *split_rows = nullptr, *tiles = nullptr;
  int n_split_rows = 0, n_tiles = 0;
  int max_split_span = 1;  // longest key range of a split row (sets the split count)
  int padding_rows = 0;
  int window = 0;  // the sliding window max_split_span was computed for
};

const void* bucket_step_cache(const PagedStep& step) {
  return step.valid ? step.cache : nullptr;
}
int bucket_step_span(const PagedStep& step) {
  return step.valid ? step.max_split_span : 0;
}

namespace {

// Checks the batch, routes its rows, and copies everything the kernels read in one transfer.
// Returns true when the device buffer was reallocated (records reading the old one are stale).
bool upload_step(PagedStep& st, const CudaPagedKvCache& c, const PagedBatch& b, int head_dim,
                 int window, cudaStream_t stream) {
  const std::vector<int32_t> row_seq = check_paged_batch(b, c.num_pages(), c.page_size());
  std::vector<int32_t> split_rows, tiles;
  st.max_split_span = 1;
  // Bucketed steps are decodes (no tiles); their padding rows go to the scratch page.
  const bool tiled = !b.bucketed && paged_tiles_supported(head_dim);
  const int real_rows = b.rows - b.padding_rows;
  std::vector<int32_t> positions(b.positions, b.positions + b.rows);
  std::vector<int64_t> slots(b.slots, b.slots + b.rows);
  std::vector<int32_t> tables(b.page_tables, b.page_tables + static_cast<size_t>(b.seqs) *
                                                                 static_cast<size_t>(b.max_pages));
  for (int r = real_rows; r < b.rows; ++r) {
    positions[static_cast<size_t>(r)] = 0;
    slots[static_cast<size_t>(r)] = int64_t{c.scratch_page()} * c.page_size();
    tables.resize(tables.size() + static_cast<size_t>(b.max_pages), -1);
    tables[tables.size() - static_cast<size_t>(b.max_pages)] = c.scratch_page();
  }
  for (int s = 0; s < b.seqs; ++s) {
    const int r0 = b.seq_starts[s], r1 = b.seq_starts[s + 1];
    bool consecutive = tiled && r1 - r0 >= kTileMinRows;
    for (int r = r0 + 1; consecutive && r < r1; ++r)
      consecutive = b.positions[r] == b.positions[r - 1] + 1;
    if (consecutive) {
      for (int r = r0; r < r1; r += kPagedTileRows)
        tiles.insert(tiles.end(), {r, std::min(kPagedTileRows, r1 - r), s});
      continue;
    }
    for (int r = r0; r < r1; ++r) {
      split_rows.push_back(r);
      const int span = window > 0 ? std::min(window, b.positions[r] + 1) : b.positions[r] + 1;
      st.max_split_span = std::max(st.max_split_span, span);
    }
  }
  for (int r = real_rows; r < b.rows; ++r) split_rows.push_back(r);
  // A record replays with other positions: the split count follows a power-of-two class of the
  // longest span (any split count covers every key: the kernel cuts [lo, hi) from the device
  // positions), so one record per class serves a batch until it outgrows the class. The longest
  // possible span instead would launch mostly empty splits at short contexts (measured on H100,
  // Llama-3-8B shape, 1 row at ~80 keys: 66 splits, +0.3 ms per step).
  if (b.bucketed) {
    int64_t limit = int64_t{b.max_pages} * c.page_size();
    if (window > 0) limit = std::min<int64_t>(limit, window);
    int64_t span = 64;
    while (span < st.max_split_span) span *= 2;
    st.max_split_span = static_cast<int>(std::min(span, limit));
  }
  const size_t rows = static_cast<size_t>(b.rows);
  const size_t table_ints = tables.size();
  const size_t ints = 2 * rows + table_ints + split_rows.size() + tiles.size();
  const size_t bytes = rows * sizeof(int64_t) + ints * sizeof(int32_t);
  // The previous step's copy must be done before the pinned buffer is overwritten.
  GYRE_CUDA_CHECK(cudaEventSynchronize(st.copied));
  const bool grow = bytes > st.capacity;
  if (grow) {
    const size_t cap = std::max(bytes, 2 * st.capacity);
    GYRE_CUDA_CHECK(cudaStreamSynchronize(stream));  // kernels may still read the old buffer
    st.pinned = pinned_alloc(cap, "the batch plan of a serving step");
    st.device = device_alloc(cap, "the batch plan of a serving step");
    st.capacity = cap;
  }
  auto* host = static_cast<uint8_t*>(st.pinned.get());
  auto* dev = static_cast<uint8_t*>(st.device.get());
  size_t at = 0;
  auto put = [&](const void* src, size_t n) {
    if (n > 0) std::memcpy(host + at, src, n);
    const uint8_t* where = dev + at;
    at += n;
    return where;
  };
  st.slots = reinterpret_cast<const int64_t*>(put(slots.data(), rows * sizeof(int64_t)));
  st.positions = reinterpret_cast<const int32_t*>(put(positions.data(), rows * 4));
  st.row_seq = reinterpret_cast<const int32_t*>(put(row_seq.data(), rows * 4));
  st.page_tables = reinterpret_cast<const int32_t*>(put(tables.data(), table_ints * 4));
  st.split_rows = reinterpret_cast<const int32_t*>(put(split_rows.data(), split_rows.size() * 4));
  st.tiles = reinterpret_cast<const int32_t*>(put(tiles.data(), tiles.size() * 4));
  if (bytes > 0) {
    GYRE_CUDA_CHECK(
        cudaMemcpyAsync(st.device.get(), st.pinned.get(), bytes, cudaMemcpyHostToDevice, stream));
    GYRE_CUDA_CHECK(cudaEventRecord(st.copied, stream));
  }
  st.n_split_rows = static_cast<int>(split_rows.size());
  st.n_tiles = static_cast<int>(tiles.size() / 3);
  st.rows = b.rows;
  st.seqs = b.seqs;
  st.max_pages = b.max_pages;
  st.generation = b.generation;
  st.cache = &c;
  st.padding_rows = b.padding_rows;
  st.window = window;
  st.valid = true;
  return grow;
}

bool staged(const PagedStep& st, const PagedKvCache& cache, const PagedBatch& b) {
  return st.valid && st.generation == b.generation && st.cache == &cache && st.rows == b.rows &&
         st.seqs == b.seqs && st.max_pages == b.max_pages && st.padding_rows == b.padding_rows;
}

}  // namespace

std::unique_ptr<PagedKvCache> CudaBackend::new_paged_kv_cache(int n_layers, int n_kv_heads,
                                                              int head_dim, int num_pages,
                                                              int page_size) {
  drop_graph();
  auto cache = std::make_unique<CudaPagedKvCache>(n_layers, n_kv_heads, head_dim, num_pages,
                                                  page_size, kv_type_);
  kv_bytes_ += cache->bytes();
  const CudaMemoryReport m = memory_report();
  std::fprintf(stderr,
               "gyre: %s: weights %.1f MiB, paged KV cache %.1f MiB (%d pages of %d tokens, %s), "
               "%.1f MiB free of %.1f MiB\n",
               name_.c_str(), mib(m.weights), mib(cache->bytes()), num_pages, page_size,
               kv_type_name(kv_type_), mib(m.free), mib(m.total));
  return cache;
}

void CudaBackend::copy_kv_page(PagedKvCache& cache, int src, int dst, int num_tokens) {
  CudaPagedKvCache& c = cuda_cache(cache);
  GYRE_CHECK(src >= 0 && src < c.num_pages() && dst >= 0 && dst < c.num_pages() && src != dst,
             "copy_kv_page: pages ", src, " -> ", dst, " are not two pages of ", c.num_pages());
  GYRE_CHECK(num_tokens >= 0 && num_tokens <= c.page_size(), "copy_kv_page: ", num_tokens,
             " tokens do not fit a page of ", c.page_size());
  if (num_tokens == 0) return;
  // Per head, the first num_tokens rows of the page: one 2-D copy per layer, kind and plane
  // (codes, then the q8/q4 params).
  const size_t row_sizes[2] = {kv_code_bytes(c.type, c.head_dim),
                               kv_param_halves(c.type, c.head_dim) * sizeof(half)};
  const size_t page_size = static_cast<size_t>(c.page_size());
  for (int layer = 0; layer < c.n_layers; ++layer)
    for (int kv = 0; kv < 2; ++kv)
      for (int part = 0; part < 2; ++part) {
        const size_t row = row_sizes[part];
        if (row == 0) continue;
        auto* plane = static_cast<uint8_t*>(part == 0 ? c.codes(layer, kv)
                                                      : static_cast<void*>(c.params(layer, kv)));
        const size_t page_bytes = c.page_rows() * row;
        GYRE_CUDA_CHECK(cudaMemcpy2DAsync(
            plane + static_cast<size_t>(dst) * page_bytes, page_size * row,
            plane + static_cast<size_t>(src) * page_bytes, page_size * row,
            static_cast<size_t>(num_tokens) * row, static_cast<size_t>(c.n_kv_heads),
            cudaMemcpyDeviceToDevice, stream_));
      }
}

void CudaBackend::attention_paged(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                                  PagedKvCache& cache, int layer, const PagedBatch& batch,
                                  const AttentionParams& p) {
  attend_paged(out, q, k, v, cache, layer, batch, p, nullptr);
}

void CudaBackend::rope_attention_paged(Tensor& out, Tensor& q, Tensor& k, const Tensor& v,
                                       PagedKvCache& cache, int layer, const PagedBatch& batch,
                                       const AttentionParams& p, const RopeTable& table) {
  if (!fused_rope_store_) {  // GYRE_CUDA_FUSED_ROPE=0: rope_qk, then attention_paged
    Backend::rope_attention_paged(out, q, k, v, cache, layer, batch, p, table);
    return;
  }
  attend_paged(out, q, k, v, cache, layer, batch, p, &table);
}

void CudaBackend::attend_paged(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                               PagedKvCache& cache, int layer, const PagedBatch& batch,
                               const AttentionParams& p, const RopeTable* rope) {
  att_permuted_ = {};  // the paged kernels write the natural order
  CudaPagedKvCache& c = cuda_cache(cache);
  check_paged_heads(p, c.n_kv_heads, c.head_dim, c.n_layers, layer);
  const int64_t n = batch.rows;
  const int64_t q_cols = static_cast<int64_t>(p.n_heads) * p.head_dim;
  const int64_t kv_cols = static_cast<int64_t>(p.n_kv_heads) * p.head_dim;
  for (const Tensor* t : {static_cast<const Tensor*>(&out), &q, &k, &v})
    GYRE_CHECK(t->dtype == DType::F16 && t->rows == n, "paged attention: inputs must be F16 with ",
               n, " rows");
  GYRE_CHECK(q.cols == q_cols && out.cols == q_cols && k.cols == kv_cols && v.cols == kv_cols,
             "paged attention: q/out need ", q_cols, " columns and k/v ", kv_cols);

  // Before the step's upload: a new table synchronizes the stream once.
  const float* inv_freq = rope ? checked_rope_table(*rope, p.head_dim) : nullptr;
  if (!paged_step_) paged_step_ = std::make_shared<PagedStep>();
  PagedStep& st = batch.bucketed ? bucket_step(batch.rows) : *paged_step_;
  if (!staged(st, cache, batch) || st.window != p.sliding_window) {
    // A record must read device arrays staged before it (stage_paged_step), not copy its own.
    GYRE_CHECK(!capturing_, "internal: paged attention recorded without its staged batch");
    if (upload_step(st, c, batch, p.head_dim, p.sliding_window, stream_) && batch.bucketed)
      drop_bucket_graphs(batch.rows);
  }
  if (n == 0) return;

  KvStoreArgs store;
  store.k_codes = c.codes(layer, 0);
  store.v_codes = c.codes(layer, 1);
  store.k_params = c.params(layer, 0);
  store.v_params = c.params(layer, 1);
  store.kv_type = static_cast<int>(c.type);
  store.n = static_cast<int>(n);
  store.n_kv_heads = p.n_kv_heads;
  store.head_dim = p.head_dim;
  PagedRopeStoreArgs rs;
  if (rope) {
    // q is the caller's non-const tensor (rope_attention_paged).
    rs.rope = rope_store_args(static_cast<half*>(q.data), k, v, store, *rope, inv_freq, p.n_heads);
    rs.positions = st.positions;
    rs.slots = st.slots;
    rs.page_size = c.page_size();
  }

  PagedAttentionArgs a;
  a.q = static_cast<const half*>(q.data);
  a.out = static_cast<half*>(out.data);
  a.k_cache = store.k_codes;
  a.v_cache = store.v_codes;
  a.k_params = store.k_params;
  a.v_params = store.v_params;
  a.kv_type = store.kv_type;
  a.positions = st.positions;
  a.row_seq = st.row_seq;
  a.page_tables = st.page_tables;
  a.max_pages = st.max_pages;
  a.page_size = c.page_size();
  a.n_heads = p.n_heads;
  a.n_kv_heads = p.n_kv_heads;
  a.head_dim = p.head_dim;
  a.window = p.sliding_window;
  a.scale = p.scale;
  a.split_rows = st.split_rows;
  a.n_split_rows = st.n_split_rows;
  a.tiles = st.tiles;
  a.n_tiles = st.n_tiles;
  a.splits = attention_splits(std::max(1, st.n_split_rows), p.n_heads, p.n_kv_heads, p.head_dim,
                              a.kv_type, st.max_split_span, sm_count_);
  if (forced_paged_splits() > 0) a.splits = forced_paged_splits();
  if (a.splits > 1)
    a.partial = workspace(paged_workspace_floats(st.n_split_rows, p.n_heads, p.head_dim, a.splits));
  set_split_combine(a, attention_counters(st.n_split_rows, p.n_heads, p.n_kv_heads));
  // A decode-only step (each row its sequence's only one, padding rows included) rotates and
  // stores inside the decode kernel (GYRE_CUDA_ROPE_IN_ATTENTION=0: never).
  if (rope && rope_in_attention_ && batch.rows == batch.seqs + batch.padding_rows) {
    a.rope = rs.rope;
    a.slots = st.slots;
    a.fuse_rope = paged_attention_fuses_rope(a);
  }
  if (rope && !a.fuse_rope)
    paged_rope_store(rs, stream_);
  else if (!rope)
    paged_kv_store(store, st.slots, c.page_size(), static_cast<const half*>(k.data),
                   static_cast<const half*>(v.data), stream_);
  paged_attention(a, stream_);
}

PagedStep& CudaBackend::bucket_step(int rows) {
  for (auto& [r, step] : bucket_steps_)
    if (r == rows) return *step;
  bucket_steps_.emplace_back(rows, std::make_shared<PagedStep>());
  return *bucket_steps_.back().second;
}

void CudaBackend::stage_paged_step(const PagedBatch& batch, PagedKvCache& cache) {
  GYRE_CHECK(batch.bucketed, "internal: stage_paged_step of a batch that is not bucketed");
  GYRE_CHECK(!capturing_, "internal: stage_paged_step while capturing a CUDA graph");
  PagedStep& st = bucket_step(batch.rows);
  // The window only sets the split count; attention_paged restages when it differs.
  if (upload_step(st, cuda_cache(cache), batch, 0, st.valid ? st.window : 0, stream_))
    drop_bucket_graphs(batch.rows);
}

}  // namespace gyre::cuda
