// The op interface every compute backend implements. The forward pass (engine/transformer.cc) is
// written once against it; the CPU backend is the reference the others are tested against.
//
// Activations are 2-D [n_tokens, width], row-major, in the backend's activation dtype. Linear
// weights are [out, in]. A Tensor's data pointer belongs to the backend that made it (host or
// device memory); callers never dereference it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace gyre {

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0;
  std::shared_ptr<void> owner;  // keeps the allocation alive; null for views

  size_t row_bytes() const { return dtype_row_bytes(dtype, cols); }
  // Rows [r0, r0 + n) of this tensor, sharing its memory.
  Tensor slice_rows(int64_t r0, int64_t n) const {
    Tensor t = *this;
    t.data = static_cast<uint8_t*>(data) + static_cast<size_t>(r0) * row_bytes();
    t.rows = n;
    return t;
  }
};

// Rotary embedding for one model: inverse frequencies of the rot_dim/2 pairs of a head.
struct RopeTable {
  std::vector<float> inv_freq;
  int rot_dim = 0;
  bool interleaved = false;  // pairs (2i, 2i+1) instead of (i, i + rot_dim/2)
  float attn_factor = 1.0f;  // scales cos/sin (YaRN mscale); 1 otherwise
};

struct AttentionParams {
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 0.0f;      // usually 1/sqrt(head_dim)
  int sliding_window = 0;  // 0: attend to every earlier position
};

// Keys and values of one sequence for every layer, owned by the backend.
class KvCache {
 public:
  virtual ~KvCache() = default;
  virtual int max_seq() const = 0;
  virtual size_t bytes() const = 0;
};

// How upload_fused combines weights that share an input. Concat: the parts' rows stacked in order
// (Q|K|V, and their biases), for matmul_split. GateUp: {gate, up} of one shape, for
// matmul_swiglu; the row order inside is the backend's own (CUDA interleaves them).
enum class FusedKind { Concat, GateUp };

// Keys and values of many sequences for every layer, in a pool of pages of page_size token
// slots (engine/kv_pages.h decides which page holds which positions of which sequence).
class PagedKvCache {
 public:
  virtual ~PagedKvCache() = default;
  virtual int num_pages() const = 0;
  virtual int page_size() const = 0;
  virtual size_t bytes() const = 0;
};

// One step of ragged sequences run together (engine/scheduler.h FlatBatch, as host pointers).
// Row r is the r-th token of the step; sequence s owns rows [seq_starts[s], seq_starts[s + 1]).
struct PagedBatch {
  int rows = 0, seqs = 0;
  const int32_t* positions = nullptr;     // [rows] position of each row in its sequence
  const int64_t* slots = nullptr;         // [rows] slot written: page * page_size + pos % page_size
  const int32_t* seq_starts = nullptr;    // [seqs + 1]
  const int32_t* context_lens = nullptr;  // [seqs] positions attended to after this step
  const int32_t* page_tables = nullptr;   // [seqs][max_pages], padded with -1
  int max_pages = 0;
  // Differs between batches with different contents: a device backend may upload the arrays
  // once per step (at the first layer) and reuse them while the generation is unchanged.
  uint64_t generation = 0;
  // A decode step padded to a bucket of rows (Backend::decode_bucket) that a graph may record
  // and replay with other contents: launch shapes must depend on rows and max_pages only, never
  // on positions. Its last padding_rows rows belong to no sequence (seq_starts[seqs] is
  // rows - padding_rows): the backend computes them harmlessly (keys and values go to a scratch
  // slot of its own, outputs are unspecified) and the caller ignores them.
  bool bucketed = false;
  int padding_rows = 0;
};

// Checks a step's plan against a pool of num_pages pages of page_size slots before anything is
// written (a bad plan must not scribble over other pages: the kernels trust slots and page
// tables); throws gyre::Error naming the problem. Returns the sequence of every row (padding rows
// of a bucketed step: seqs, seqs + 1, ... after the real ones).
std::vector<int32_t> check_paged_batch(const PagedBatch& batch, int num_pages, int page_size);
// Checks that attention params p fit a paged cache of n_kv_heads heads of head_dim and n_layers
// layers, and that layer is one of them.
void check_paged_heads(const AttentionParams& p, int n_kv_heads, int head_dim, int n_layers,
                       int layer);

// Per-row settings of Backend::sample. The semantics (order of the filters, tie rules) are the
// host reference in backend/sample_host.h; engine/sampler.h documents them for users.
struct SampleRequest {
  float temperature = 0.0f;  // <= 0: greedy (argmax, lowest id on ties); the filters are skipped
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  float min_p = 0.0f;        // 0 = off
  float typical_p = 1.0f;    // 1 = off
  double uniform = 0.0;      // [0, 1): the draw, taken by the caller from the request's own RNG
  // Penalties on the raw logits before everything else: (id, count) of the recent tokens.
  float repetition_penalty = 1.0f, frequency_penalty = 0.0f, presence_penalty = 0.0f;
  std::vector<std::pair<int, int>> penalty_counts;
  bool logprob = false;  // the chosen id's log-probability under the raw logits (log-softmax)
  int top_logprobs = 0;  // 0..kMaxTopLogprobs: best raw logits as (id, logprob), best first
  bool has_penalties() const {
    return repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f;
  }
};
constexpr int kMaxTopLogprobs = 20;

struct SampleResult {
  int id = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int, float>> top_logprobs;
  std::string error;  // non-empty: this row could not be sampled (e.g. no finite logit)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // Activation buffer [rows, cols] in the backend's activation dtype.
  virtual Tensor alloc(int64_t rows, int64_t cols) = 0;
  // A weight from the model file (any dtype, including GGUF blocks) in the backend's layout.
  // 1-D tensors (norms, biases) become one row.
  virtual Tensor upload_weight(const TensorView& w) = 0;
  // Copies an activation tensor to the host as floats (rows * cols of them).
  virtual void to_host(const Tensor& t, float* dst) = 0;
  virtual std::unique_ptr<KvCache> new_kv_cache(int n_layers, int n_kv_heads, int head_dim,
                                                int max_seq) = 0;
  virtual void synchronize() {}

  // out[i] = table[tokens[i]]
  virtual void embed(Tensor& out, const Tensor& table, const int32_t* tokens, int n) = 0;
  // out = x / rms(x) * w, per row
  virtual void rmsnorm(Tensor& out, const Tensor& x, const Tensor& w, float eps) = 0;
  // residual += delta; out = rmsnorm(residual) * w  (the fused add + norm between sublayers)
  virtual void add_rmsnorm(Tensor& residual, Tensor& out, const Tensor& delta, const Tensor& w,
                           float eps) = 0;
  // out[n, o] = x[n, i] . w[o, i] (+ bias[o])
  virtual void matmul(Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias) = 0;
  // One weight made of several (same dtype and column count; 1-D parts are concatenated).
  // Default: the rows stacked on the host, then upload_weight.
  virtual Tensor upload_fused(const std::vector<TensorView>& parts, FusedKind kind);
  // outs[i] = x . (part i of a Concat weight w) (+ the matching slice of bias, from
  // upload_fused of the parts' biases); outs[i]->cols gives each part's rows, in order.
  virtual void matmul_split(const std::vector<Tensor*>& outs, const Tensor& x, const Tensor& w,
                            const Tensor* bias);
  // out = silu(x . gate) * (x . up) for w = upload_fused({gate, up}, GateUp); out [n, hidden].
  virtual void matmul_swiglu(Tensor& out, const Tensor& x, const Tensor& w_gate_up);
  // ---- Decode fusions (optional). The forward pass uses them for n rows through weights like w
  // when fuses_norms(n, w): the RMSNorm folded into the next matmul's input (x is the residual
  // stream, norm its weight; scratch [n, x.cols] may receive rmsnorm(x)) and the residual add
  // folded into the output of the matmul before it. The defaults run the separate ops.
  struct NormedInput {
    const Tensor& x;
    const Tensor& norm;
    float eps;
    Tensor& scratch;
  };
  virtual bool fuses_norms(int /*n*/, const Tensor& /*w*/) const { return false; }
  virtual void norm_matmul_split(const std::vector<Tensor*>& outs, const NormedInput& in,
                                 const Tensor& w, const Tensor* bias);
  // reader: the weight whose matmul_add alone reads out next (or null); a backend may leave out
  // in the order that weight's kernel reads it, so out is for that matmul_add only.
  virtual void norm_matmul_swiglu(Tensor& out, const NormedInput& in, const Tensor& w_gate_up,
                                  const Tensor* reader = nullptr);
  // residual += x . w (scratch [n, w.rows] may receive x . w first). next: the weight whose
  // norm_matmul_split / norm_matmul_swiglu reads residual next, with no other write to residual in
  // between (or null); a backend may hand that weight's kernel residual in the order it reads it.
  virtual void matmul_add(Tensor& residual, const Tensor& x, const Tensor& w, Tensor& scratch,
                          const Tensor* next = nullptr);
  // Rotates each head of x [n, n_heads * head_dim] in place; token i is at positions[i].
  virtual void rope(Tensor& x, int n_heads, int head_dim, const int32_t* positions,
                    const RopeTable& table) = 0;
  // rope of q [n, n_heads * head_dim] and k [n, n_kv_heads * head_dim] at the same positions.
  // Default: two rope calls; a backend may do both in one launch.
  virtual void rope_qk(Tensor& q, int n_heads, Tensor& k, int n_kv_heads, int head_dim,
                       const int32_t* positions, const RopeTable& table);
  // Stores k, v [n, n_kv_heads * head_dim] at positions pos0.. of layer `layer` in the cache, then
  // out[i] = causal attention of q[i] (position pos0 + i) over cache positions 0..pos0+i.
  virtual void attention(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                         KvCache& cache, int layer, int pos0, const AttentionParams& p) = 0;
  // rope_qk of q and k at positions pos0.., then attention (q's and k's contents afterwards are
  // unspecified). Default: those two calls; a backend may rotate k on its way into the cache and
  // q as the attention reads it instead (CUDA: one kernel for a decode row). reader: the weight
  // whose matmul_add alone reads out next (or null); a backend may leave out in the order that
  // weight's kernel reads it, so out is for that matmul_add only.
  virtual void rope_attention(Tensor& out, Tensor& q, Tensor& k, const Tensor& v, KvCache& cache,
                              int layer, int pos0, const AttentionParams& p, const RopeTable& table,
                              const Tensor* reader = nullptr);
  // ---- Batched serving (paged KV cache). The defaults throw: not every backend has them. ----
  virtual std::unique_ptr<PagedKvCache> new_paged_kv_cache(int n_layers, int n_kv_heads,
                                                           int head_dim, int num_pages,
                                                           int page_size);
  // Copies the first num_tokens slots of page src to page dst, every layer, keys and values.
  virtual void copy_kv_page(PagedKvCache& cache, int src, int dst, int num_tokens);
  // Stores the k, v rows [rows, n_kv_heads * head_dim] of layer `layer` at their slots, then
  // out[r] = causal attention of q[r] over positions [0, positions[r]] (or the sliding window)
  // of row r's sequence, read through its page table.
  virtual void attention_paged(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                               PagedKvCache& cache, int layer, const PagedBatch& batch,
                               const AttentionParams& p);
  // rope_qk of q and k at the batch's positions, then attention_paged (q's and k's contents
  // afterwards are unspecified). Default: those two calls; a backend may rotate k on its way into
  // the cache and q as the attention reads it instead (CUDA: decode-only steps).
  virtual void rope_attention_paged(Tensor& out, Tensor& q, Tensor& k, const Tensor& v,
                                    PagedKvCache& cache, int layer, const PagedBatch& batch,
                                    const AttentionParams& p, const RopeTable& table);

  // Samples each of the first n rows of logits (vocabulary-wide rows, e.g. the LM head's output)
  // with its own request; only the results come back to the host. Default: the rows are copied
  // to the host and sampled by the host reference (sample_host.h).
  virtual void sample(const Tensor& logits, const SampleRequest* requests, int n,
                      SampleResult* out);

  // out = silu(gate) * up
  virtual void silu_mul(Tensor& out, const Tensor& gate, const Tensor& up) = 0;
  // x += y
  virtual void add(Tensor& x, const Tensor& y) = 0;

  // Whole-step replay (CUDA graphs), used by the forward pass only when graph_capable(). The ops
  // copy their host inputs (tokens, positions, pos0) into buffers the backend owns before use,
  // so a recorded step reads them from there: stage_step_inputs() fills those buffers with the
  // next step's values, replay_step() re-runs the ops recorded between capture_begin() and
  // capture_end(true) (false: an op failed, nothing is kept) and returns false when there is no
  // usable record (none made yet, or a buffer it used was reallocated since). Records are kept
  // per (owner, bucket): `owner` is the caller (the Transformer), so two models sharing a
  // backend never replay each other's; `bucket` is 0 for the single-sequence decode step and B
  // for batched decode steps padded to B rows (a backend may keep several records per bucket,
  // e.g. per paged cache, and picks the one matching what stage_paged_step staged).
  // Whether the forward pass should renumber the MLP's hidden units into an act-order
  // down_proj's column order at load (engine/mlp_order.h), so that down_proj never gathers its
  // input. Only for backends whose uploads copy the weights (the rewritten ones live only for
  // the call).
  virtual bool wants_mlp_in_down_order() const { return false; }
  virtual bool graph_capable() const { return false; }
  virtual void stage_step_inputs(const int32_t* /*tokens*/, const int32_t* /*positions*/, int /*n*/,
                                 int /*pos0*/) {}
  virtual void capture_begin(const void* /*owner*/, int /*bucket*/) {}
  virtual void capture_end(bool /*keep*/) {}
  virtual bool replay_step(const void* /*owner*/, int /*bucket*/) { return false; }
  // Batched decode steps (every sequence one row): the row count such a step of `rows` rows is
  // padded to (PagedBatch::bucketed), so that one record per bucket serves every such step; 0:
  // the step runs as it is (the default, and beyond the largest bucket).
  virtual int decode_bucket(int /*rows*/) const { return 0; }
  // Uploads a bucketed batch's arrays to the bucket's fixed device buffers now: before a
  // replay_step (which calls no attention_paged) and before recording it.
  virtual void stage_paged_step(const PagedBatch& /*batch*/, PagedKvCache& /*cache*/) {}
  // Fed decode (Transformer::decode_fed): from fed_steps_begin(token, pos, first) until
  // fed_steps_end, the step inputs (token, position) stay on the device, and fed_pick, the step's
  // last op, picks from its logits row as `first` asks (greedy, or sampled without penalties and
  // with the draw that fed_stage(pos, request) gave the step at `pos` before its launch), writes
  // the pick there as the next step's token and advances the position, so that the host enqueues
  // steps without waiting for them. fed_step_launched(pos) follows the launch of the step at `pos`;
  // fed_result(pos) waits for it and returns its id (throws when every logit is NaN). A backend
  // returns false from fed_steps_begin where it cannot serve such requests (all by default).
  virtual bool fed_steps_begin(int /*token*/, int /*pos*/, const SampleRequest& /*first*/) {
    return false;
  }
  virtual void fed_stage(int /*pos*/, const SampleRequest& /*request*/) {}
  virtual void fed_pick(const Tensor& /*logits*/) {}
  virtual void fed_step_launched(int /*pos*/) {}
  virtual int fed_result(int /*pos*/) { return -1; }
  virtual void fed_steps_end() {}
};

// How a backend stores what it is given. The CPU backend honours n_threads and kv_cache.
struct BackendOptions {
  int n_threads = 0;     // <= 0: all cores
  int weight_bits = 0;   // 0: the file's precision (F16/BF16 -> FP16; GGUF blocks repacked);
                         // 2..6 or 8: requantize F16/BF16/F32 linear weights at load
                         // (CUDA; synthetic weights: random codes in that layout)
  int group_size = 128;  // for weight_bits 2..8
  // "f16", "q8", "q4" (core/kv_quant.h); the CPU keeps "f16" caches in f32, its exact reference.
  std::string kv_cache = "f16";
};

// "cpu" or "cuda" / "cuda:N"; "auto" picks CUDA when a GPU is present. Throws on an unknown or
// unavailable device.
std::unique_ptr<Backend> backend_create(const std::string& device, int n_threads);
std::unique_ptr<Backend> backend_create(const std::string& device, const BackendOptions& options);
bool cuda_available();

}  // namespace gyre
