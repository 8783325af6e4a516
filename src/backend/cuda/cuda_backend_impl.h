// The CUDA backend class. Activations are FP16 [rows, cols] in device memory, accumulation is
// f32 in every kernel; linear weights are FP16 [out, in]. Every op is asynchronous on one stream;
// only to_host (and uploads) wait. Per-step host inputs (tokens, positions, pos0) go through
// pinned staging buffers so that a captured decode step (CUDA graph) replays with new values.
#pragma once
#include <cublas_v2.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/hadamard.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "core/kv_quant.h"

namespace gyre {
struct QWeightDesc;
struct QWeightDevice;
struct QMixedDevice;
struct QMixedHost;
struct QlinearFusion;
}  // namespace gyre

namespace gyre::cuda {

struct SampleRowParams;                // sampling.h
struct PagedStep;                      // the device copy of a step's PagedBatch (cuda_paged.cc)
constexpr int kMaxDecodeBucket = 128;  // larger decode steps run unpadded, without a record
// What a bucketed step was last staged with: its cache, and the key span its split count follows
// (records are kept per both).
const void* bucket_step_cache(const PagedStep& step);
int bucket_step_span(const PagedStep& step);

// Linear weights packed by qlinear (cuda_qweights.cc).
bool is_quantized_tensor(const Tensor& t);
const QWeightDevice& qweight_of(const Tensor& t);
// Mixed-width weights (cuda_qmixed.cc, qmixed_device.h).
bool is_mixed_tensor(const Tensor& t);
const QMixedDevice& qmixed_of(const Tensor& t);
// Device copy of a rotation's signs (cuda_hadamard.cc; validated against cols first).
std::shared_ptr<void> upload_hadamard_signs(const HadamardRotation& had, int64_t cols);
// Fused weights kept as quantized parts of different layouts (cuda_fused_parts.cc); off with
// GYRE_CUDA_FUSED_PARTS=0 (such parts are then fused as FP16).
bool is_parts_tensor(const Tensor& t);
bool fused_parts_enabled();

class CudaKvCache final : public KvCache {
 public:
  CudaKvCache(int n_layers, int n_kv_heads, int head_dim, int max_seq, KvType type);
  int max_seq() const override { return max_seq_; }
  size_t bytes() const override { return bytes_; }
  // Layer `layer`'s keys (kv 0) or values (kv 1): codes [n_kv_heads][max_seq][row codes] (FP16
  // caches: the halves) and params [n_kv_heads][max_seq][row params] (null for FP16); the row
  // format is core/kv_quant.h's.
  void* codes(int layer, int kv) const;
  half* params(int layer, int kv) const;

  const int n_layers, n_kv_heads, head_dim;
  const KvType type;

 private:
  int max_seq_;
  size_t bytes_ = 0, code_plane_ = 0, param_plane_ = 0;  // plane sizes in bytes
  std::shared_ptr<void> codes_, params_;
};

// Host values copied to the device through pinned memory; the copy is skipped when the values
// did not change since the last one (rope and attention run per layer with the same positions).
struct StagedInts {
  std::shared_ptr<void> pinned, device;
  int capacity = 0;
  std::vector<int32_t> current;
  bool valid = false;
  cudaEvent_t copied = nullptr;  // the last copy out of `pinned` (before it is overwritten)
};

// Split attention: contexts of at most this many keys are attended by one block per head group
// (no partials). Measured (H100, bench/NOTES.md "attn1"): one block beats the split + in-kernel
// combine up to ~170 keys for the Llama-3-8B shape (100 keys: 5.7 vs 7.2 us), ~100 for MHA.
constexpr int kDefaultSingleSpan = 128;
// ... and contexts of more keys let the next kernel launch (PDL) only after their keys are read
// (split_share::Combine::trigger_span).
constexpr int kDefaultTriggerSpan = 1024;

// The fused rope/store arguments (cuda_common.h) of q (rotated in place), k and v.
RopeStoreArgs rope_store_args(half* q, const Tensor& k, const Tensor& v, const KvStoreArgs& store,
                              const RopeTable& table, const float* inv_freq, int n_heads);

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const BackendOptions& options);
  ~CudaBackend() override;
  std::string name() const override { return name_; }

  Tensor alloc(int64_t rows, int64_t cols) override;
  Tensor upload_weight(const TensorView& w) override;
  void to_host(const Tensor& t, float* dst) override;
  std::unique_ptr<KvCache> new_kv_cache(int n_layers, int n_kv_heads, int head_dim,
                                        int max_seq) override;
  void synchronize() override;

  void embed(Tensor& out, const Tensor& table, const int32_t* tokens, int n) override;
  void rmsnorm(Tensor& out, const Tensor& x, const Tensor& w, float eps) override;
  void add_rmsnorm(Tensor& residual, Tensor& out, const Tensor& delta, const Tensor& w,
                   float eps) override;
  void matmul(Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias) override;
  void rope_qk(Tensor& q, int n_heads, Tensor& k, int n_kv_heads, int head_dim,
               const int32_t* positions, const RopeTable& table) override;
  void rope(Tensor& x, int n_heads, int head_dim, const int32_t* positions,
            const RopeTable& table) override;
  void attention(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, KvCache& cache,
                 int layer, int pos0, const AttentionParams& p) override;
  // One kernel rotates q and k and stores k, v (GYRE_CUDA_FUSED_ROPE=0: rope_qk + attention).
  void rope_attention(Tensor& out, Tensor& q, Tensor& k, const Tensor& v, KvCache& cache, int layer,
                      int pos0, const AttentionParams& p, const RopeTable& table,
                      const Tensor* reader = nullptr) override;
  void silu_mul(Tensor& out, const Tensor& gate, const Tensor& up) override;
  // Fused projections (cuda_fused.cc): Q|K|V rows stacked, gate/up interleaved by 8 rows.
  Tensor upload_fused(const std::vector<TensorView>& parts, FusedKind kind) override;
  void matmul_split(const std::vector<Tensor*>& outs, const Tensor& x, const Tensor& w,
                    const Tensor* bias) override;
  void matmul_swiglu(Tensor& out, const Tensor& x, const Tensor& w_gate_up) override;
  bool fuses_norms(int n, const Tensor& w) const override;
  bool wants_mlp_in_down_order() const override { return true; }  // uploads copy
  void norm_matmul_split(const std::vector<Tensor*>& outs, const NormedInput& in, const Tensor& w,
                         const Tensor* bias) override;
  void norm_matmul_swiglu(Tensor& out, const NormedInput& in, const Tensor& w_gate_up,
                          const Tensor* reader = nullptr) override;
  void matmul_add(Tensor& residual, const Tensor& x, const Tensor& w, Tensor& scratch,
                  const Tensor* next = nullptr) override;
  void add(Tensor& x, const Tensor& y) override;
  // On the GPU (cuda_sample.cc, sampling.cu); rows with penalties or typical_p go to the host
  // reference. GYRE_CUDA_SAMPLE=0 in the environment sends every row there (for comparisons).
  void sample(const Tensor& logits, const SampleRequest* requests, int n,
              SampleResult* out) override;
  // Batched serving over a paged KV cache (cuda_paged.cc).
  std::unique_ptr<PagedKvCache> new_paged_kv_cache(int n_layers, int n_kv_heads, int head_dim,
                                                   int num_pages, int page_size) override;
  void copy_kv_page(PagedKvCache& cache, int src, int dst, int num_tokens) override;
  void attention_paged(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                       PagedKvCache& cache, int layer, const PagedBatch& batch,
                       const AttentionParams& p) override;
  // One kernel rotates q and k and stores k, v (GYRE_CUDA_FUSED_ROPE=0 in the environment: the
  // default rope_qk + attention_paged, for comparisons).
  void rope_attention_paged(Tensor& out, Tensor& q, Tensor& k, const Tensor& v, PagedKvCache& cache,
                            int layer, const PagedBatch& batch, const AttentionParams& p,
                            const RopeTable& table) override;

  // GYRE_CUDA_GRAPH=0 in the environment turns decode-step graphs and buckets off (for
  // comparisons); set_decode_graphs() sets each (cuda_backend.h).
  bool graph_capable() const override { return graphs_enabled_; }
  void stage_step_inputs(const int32_t* tokens, const int32_t* positions, int n, int pos0) override;
  void capture_begin(const void* owner, int bucket) override;
  void capture_end(bool keep) override;
  bool replay_step(const void* owner, int bucket) override;
  // Powers of two up to kMaxDecodeBucket rows.
  int decode_bucket(int rows) const override;
  void stage_paged_step(const PagedBatch& batch, PagedKvCache& cache) override;
  // Fed decode steps, greedy or sampled (cuda_fed.cc; GYRE_CUDA_FED=0 in the environment: off,
  // for comparisons).
  bool fed_steps_begin(int token, int pos, const SampleRequest& first) override;
  void fed_stage(int pos, const SampleRequest& request) override;
  void fed_pick(const Tensor& logits) override;
  void fed_step_launched(int pos) override;
  int fed_result(int pos) override;
  void fed_steps_end() override;
  uint64_t fed_steps() const { return fed_steps_; }
  void set_decode_graphs(bool buckets, bool record) {
    drop_graph();
    buckets_enabled_ = buckets;
    graphs_enabled_ = record;
  }
  uint64_t graph_replays() const { return graph_replays_; }
  uint64_t permuted_handoffs() const { return permuted_handoffs_; }
  uint64_t parts_row_gathers() const { return parts_row_gathers_; }

  CudaMemoryReport memory_report();
  void set_synthetic(uint64_t seed) {
    synthetic_ = true;
    synthetic_seed_ = seed;
  }
  // Synthetic weights: k_proj, v_proj and up_proj at this width (0: all at weight_bits).
  void set_synthetic_part_bits(int bits) { synthetic_part_bits_ = bits; }
  void set_synthetic_trellis(bool on) { synthetic_trellis_ = on; }
  double measure_bandwidth();

 private:
  const int32_t* stage(StagedInts& s, const int32_t* host, int n);
  void reserve_staging(StagedInts& s, int n);
  void drop_graph();                    // every record: a buffer they may use is going away
  void drop_bucket_graphs(int bucket);  // the records of batched steps of `bucket` rows
  PagedStep& bucket_step(int rows);
  // attention_paged, with q and k rotated by the store kernel when rope is not null (q is then
  // written in place: the caller's tensor is non-const).
  void attend_paged(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                    PagedKvCache& cache, int layer, const PagedBatch& batch,
                    const AttentionParams& p, const RopeTable* rope);
  // attention, the same (contiguous cache).
  void attend(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, KvCache& cache,
              int layer, int pos0, const AttentionParams& p, const RopeTable* rope,
              const Tensor* reader = nullptr);
  // matmul_add's direct path for w at n rows (the quantized kernels add into the residual).
  bool adds_directly(const Tensor& w, int n) const;
  // The device rotary table of `rope` after checking it against head_dim.
  const float* checked_rope_table(const RopeTable& rope, int head_dim);
  Tensor device_tensor(int64_t rows, int64_t cols, const std::string& what);
  void upload_converted(half* dst, const TensorView& w);
  bool try_upload_quantized(const TensorView& w, Tensor& out);
  // A device buffer that grows on demand. Growing frees memory a recorded step may read, so it
  // drops the records, and it may not happen while one is being captured.
  struct Scratch {
    std::shared_ptr<void> mem;
    size_t bytes = 0;
    template <class T>
    T* as() const {
      return static_cast<T*>(mem.get());
    }
  };
  // Makes b at least `bytes` long; true when it was (re)allocated.
  bool grow(Scratch& b, size_t bytes, const char* what);
  float* workspace(size_t floats);
  // At least n zeroed combine counters (attention_share.cuh; the kernels leave them zero).
  unsigned* split_counters(size_t n);
  // Counters, single-block span and PDL trigger span of a split attention launch (null/0: the
  // combine kernel).
  template <class Args>
  void set_split_combine(Args& a, size_t n_counters) {
    a.trigger_span = trigger_span_;
    a.counters = nullptr;
    a.single_span = 0;
    if (a.splits <= 1 || !combine_in_kernel_) return;
    a.counters = split_counters(n_counters);
    a.single_span = single_span_;
  }
  half* fused_scratch(size_t halves);
  // The residual in an act-order weight's column order (cuda_fused.cc): matmul_add with `next`
  // writes it next to the sum; the fused-norm matmul of `next` then stages it without the
  // permutation (take_permuted: the weight without perm, that copy, the norm weights permuted).
  half* permuted_residual(size_t halves);
  struct ResidualCopy {
    half* y = nullptr;
    const int32_t* index = nullptr;  // QlinearFusion::y_perm_index
    const int32_t* key = nullptr;    // the reader's PermutedCopy::perm
  };
  ResidualCopy residual_copy(const Tensor* next, const Tensor& residual, int n);
  bool take_permuted(const NormedInput& in, const Tensor& w, QWeightDevice& plain, const half*& x,
                     const half*& norm);
  // Fused weights of parts with different layouts (cuda_fused_parts.cc): upload, one group's
  // product into its outputs, and the fused ops over the groups (f: the folded norm, if any).
  Tensor upload_parts(const std::vector<TensorView>& parts, FusedKind kind);
  void group_matmul(const Tensor& w, const half* x, const OutSplit& split, int n, const half* bias,
                    const QlinearFusion& f);
  bool parts_fuse_norms(int n, const Tensor& w) const;
  bool parts_rows_input(const Tensor& w, const half* x, int n, const QlinearFusion& f);
  void parts_matmul_split(const std::vector<Tensor*>& outs, const Tensor& x, const Tensor& w,
                          const Tensor* bias, const QlinearFusion& f);
  // reader (n = 1): the product goes into its decode row instead of out (returns true then).
  bool parts_matmul_swiglu(Tensor& out, const Tensor& x, const Tensor& w, const QlinearFusion& f,
                           const QMixedDevice* reader = nullptr);
  // Mixed-width weights (cuda_qmixed.cc): upload, y [n, rows] = W x (+ bias) as the sum of the
  // parts' products, one part's product, and the scratch of gathered inputs and partial sums.
  Tensor upload_mixed(const QMixedHost& host);
  // Benchmark weights made on the device (synthetic_): a packed weight of layout d with random
  // bytes and small positive scales, and a mixed weight as GYRE_SYNTHETIC_MIX describes.
  std::pair<std::shared_ptr<QWeightDevice>, std::shared_ptr<void>> random_packed(
      const QWeightDesc& d, const std::string& what);
  Tensor synthetic_mixed(int rows, int cols, const std::string& spec, const std::string& name);
  // y = m . x (+ bias), or y += it with accumulate; x RMS-normalised by norm [m.cols] in the
  // gather when norm is not null. y_perm (with accumulate; QlinearFusion's): the sum also in the
  // order y_perm_index gives, where every part runs direct; returns whether it was written.
  // x_in_row: x is in m.row already (the kernel before wrote it there; n = 1).
  bool mixed_matmul(const QMixedDevice& m, const half* x, half* y, int n, const half* bias,
                    bool accumulate = false, const half* norm = nullptr, float eps = 0.0f,
                    half* y_perm = nullptr, const int32_t* y_perm_index = nullptr,
                    bool x_in_row = false);
  // m's parts' inputs for n rows: gathered (one launch: x RMS-normalised by norm when not null),
  // or with row_norm (the norm weights in m.row's layout) the decode row the residual's producer
  // filled (no launch); whether every part runs through qlinear's kernels at n rows (their
  // accumulate and prior fusions), and otherwise the scratch of a part's product before its add.
  struct MixedInput {
    const half* x[6] = {};  // kMixedMaxParts (qmixed_device.h)
    int offset[6] = {};
    int x_cols = 0, norm_cols = 0;  // > 0: the shared row's (QlinearFusion::x_cols)
    const half* norm = nullptr;
    float eps = 0.0f;
    bool direct = true;
    half* partial = nullptr;
    // The rows in the weight's decode-row layout ([n, row_cols]: m.row, or gathered so for the
    // two-part kernel), else null.
    const half* row = nullptr;
  };
  MixedInput mixed_input(const QMixedDevice& m, const half* x, int n, const half* norm, float eps,
                         const half* row_norm = nullptr, bool x_in_row = false);
  QlinearFusion part_fusion(const MixedInput& in, int p);  // the shared row's, if any
  // A two-part weight at a few rows in one launch (qlinear_gemv_pair) where that kernel takes it:
  // outputs as mixed_parts' (all parts), mixed_split_in's (split) or SwiGLU's (hidden > 0);
  // false (nothing launched) otherwise.
  bool mixed_pair(const QMixedDevice& m, const MixedInput& in, int n, half* y, const half* bias,
                  const QlinearFusion& f, const OutSplit* split = nullptr, int hidden = 0);
  // The part launched i-th at n rows (QMixedDevice::order at one row, else, or with
  // GYRE_CUDA_MIXED_ORDER=0, i).
  int part_at(const QMixedDevice& m, int i, int n) const;
  // Parts [first, last) of m into y: the first writes y (+ bias) unless accumulate, the others
  // add; the last also writes y_perm (QlinearFusion's) when set. late_first: the kernel launched
  // before the first part wrote nothing it reads before its epilogue (QlinearFusion::x_ready).
  void mixed_parts(const QMixedDevice& m, const MixedInput& in, half* y, int n, int first, int last,
                   const half* bias, bool accumulate, half* y_perm = nullptr,
                   const int32_t* y_perm_index = nullptr, bool late_first = false);
  // A mixed weight's product into split outputs, or through SwiGLU into out, with the norm as
  // mixed_matmul's or row_norm's (mixed_input; the last part's kernel completing the sum:
  // cuda_qmixed.cc).
  void mixed_split(const OutSplit& split, const half* x, const Tensor& w, int n, const half* bias,
                   const half* norm, float eps, const half* row_norm = nullptr);
  void mixed_split_in(const OutSplit& split, const QMixedDevice& m, const MixedInput& in, int n,
                      const half* bias, bool late_first);
  // With reader (n = 1), the SwiGLU product goes into reader's decode row where the last part's
  // kernel writes it (returns true; out is not written then).
  bool mixed_swiglu(half* out, const half* x, const Tensor& w, int n, int hidden, const half* norm,
                    float eps, const half* row_norm = nullptr,
                    const QMixedDevice* reader = nullptr);
  // The mixed weight whose decode row out [n, w.cols] can go to (Backend's `reader`), or null.
  const QMixedDevice* row_reader(const Tensor* reader, const Tensor& out, int n) const;
  // The norm weights in w's decode-row layout when the last matmul_add wrote in.x there (its
  // record), else null.
  const half* take_mixed_row(const NormedInput& in, const Tensor& w);
  // A mixed weight whose gather can apply the norm (not rotated: the rotation comes after the
  // norm and before the gather). GYRE_CUDA_MIXED_NORM=0: never (A/B).
  bool mixed_fuses_norm(const Tensor& w) const;
  void packed_part_matmul(const QWeightDevice& w, const half* x, half* y, int n, const half* bias);
  half* mixed_scratch(size_t halves);
  // Rotated weights (cuda_hadamard.cc): x itself, or x [n, w.cols] rotated by w's R^T into
  // hadamard_scratch_ when w carries a rotation (backend/cpu/hadamard.h).
  const half* rotated_input(const Tensor& w, const half* x, int n);
  // The FP16 weight behind w: itself, or a dequantized copy in dequant_ (quantized weights). An
  // act-order weight is dequantized in its stored column order and x [n, w.cols] replaced by its
  // columns gathered into that order (in gather_).
  const half* dense_weight(const Tensor& w, const half*& x, int n);
  // out [n, o] (leading dimension ldo) = x [n, in] . w [o, in]^T through cuBLAS.
  void gemm(half* out, int ldo, const half* x, const half* w, int n, int o, int in);
  const float* rope_table(const std::vector<float>& inv_freq);
  // rope and rope_qk: x2 (n_heads2 heads) rotated in the same launch when not null.
  void rope_launch(Tensor& x, int n_heads, Tensor* x2, int n_heads2, int head_dim,
                   const int32_t* positions, const RopeTable& table);

  int device_ = 0;
  std::string name_;
  int sm_count_ = 0;
  BackendOptions options_;
  KvType kv_type_ = KvType::F16;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::shared_ptr<void> cublas_workspace_;
  StagedInts tokens_, positions_, pos0_;
  // Fed steps: stage() hands out the device copies of the three above without copying.
  static constexpr int kFedRing = 16;  // ids in flight, at most (a power of two)
  bool fed_ = false, fed_sampled_ = false;
  // Host-mapped: the picked ids, the sampled picks' parameters; device: the pick's zeroed words
  // and (sampled) its result.
  std::shared_ptr<void> fed_ring_, fed_params_, fed_words_;
  int32_t* fed_ring_device_ = nullptr;
  SampleRowParams* fed_params_device_ = nullptr;
  cudaEvent_t fed_events_[kFedRing] = {};
  uint64_t fed_steps_ = 0;
  std::vector<std::pair<std::vector<float>, std::shared_ptr<void>>> rope_tables_;
  Scratch workspace_, counters_;
  // GYRE_CUDA_SPLIT_COMBINE=kernel: the separate combine kernel (A/B); GYRE_CUDA_ATTN_SINGLE=N:
  // contexts of at most N keys are attended by one block per head group; GYRE_CUDA_ATTN_TRIGGER=N:
  // contexts of more than N keys let the next kernel in after their keys.
  bool combine_in_kernel_ = true;
  int single_span_ = kDefaultSingleSpan;
  int trigger_span_ = kDefaultTriggerSpan;  // GYRE_CUDA_ATTN_TRIGGER=N
  std::shared_ptr<void> to_host_buf_, to_host_pinned_;
  Scratch dequant_;        // FP16 copy of a quantized weight for prefill GEMMs
  Scratch gather_;         // x in an act-order weight's column order (dense_weight)
  Scratch fused_scratch_;  // GEMM output of a fused weight before its epilogue
  // Rows (x, n) held in the column order of the act-order weight with permutation perm (or in
  // the decode row of the mixed weight whose pos is perm): what the last matmul_add wrote into
  // xperm_ or that row (permuted_), what the last attention wrote into its output
  // (att_permuted_, for the matmul_add after it).
  struct PermutedCopy {
    const void* x = nullptr;
    int n = 0;
    const int32_t* perm = nullptr;
  };
  PermutedCopy permuted_, att_permuted_;
  bool permuted_residual_enabled_ = true;  // GYRE_CUDA_PERMUTED_RESIDUAL=0: never (A/B)
  bool mixed_norm_in_gather_ = true;       // GYRE_CUDA_MIXED_NORM=0: never (A/B)
  bool mixed_prior_epilogue_ = true;       // GYRE_CUDA_MIXED_PRIOR=0: never (A/B)
  bool mixed_row_enabled_ = true;          // GYRE_CUDA_MIXED_ROW=0: never (A/B)
  bool mixed_late_wait_ = true;            // GYRE_CUDA_MIXED_LATE=0: never (A/B)
  bool parts_rows_enabled_ = true;         // GYRE_CUDA_PARTS_ROWS=0: never (A/B)
  bool mixed_order_ = true;                // GYRE_CUDA_MIXED_ORDER=0: parts in stored order (A/B)
  uint64_t permuted_handoffs_ = 0, parts_row_gathers_ = 0;
  Scratch xperm_;
  // Norm weights in an act-order weight's column order, by (norm, perm); made on first use and
  // remade when either tensor behind the key is gone (its memory may serve a new model's).
  struct PermutedNorm {
    std::weak_ptr<void> norm_owner, weight_owner;
    std::shared_ptr<void> values;
  };
  std::map<std::pair<const void*, const int32_t*>, PermutedNorm> permuted_norms_;
  Scratch mixed_scratch_;     // gathered inputs and partial products of mixed weights
  Scratch hadamard_scratch_;  // rotated inputs of rotated weights
  size_t to_host_floats_ = 0;
  std::shared_ptr<void> sample_pinned_, sample_device_;  // per-row parameters, then results
  int sample_rows_ = 0;
  // A recorded step; a batched one replays only with the paged cache and split span it was
  // recorded with.
  struct Record {
    const void* owner = nullptr;
    int bucket = 0;
    const void* cache = nullptr;
    int span = 0;
    cudaGraphExec_t exec = nullptr;
  };
  // The record that would serve (owner, bucket) with what is staged now.
  std::vector<Record>::iterator find_record(const void* owner, int bucket);
  std::vector<Record> graphs_;
  const void* capture_owner_ = nullptr;
  int capture_bucket_ = 0;
  bool capturing_ = false;
  bool graphs_enabled_ = true, buckets_enabled_ = true;
  bool fused_rope_store_ = true;  // also the contiguous cache's rope_attention
  // GYRE_CUDA_ROPE_IN_ATTENTION=0: a decode step's rope + KV store stays its own launch.
  bool rope_in_attention_ = true;
  // GYRE_CUDA_ATTN_CHUNK=N: the contiguous decode attention's smallest share of keys (32..1024).
  // 64 = one 16-key step for each of the decode block's 4 warps (H100, 4-bit Llama-3-8B decode
  // at 129-256 keys: 458.1 -> 461.6-464.7 tok/s against 32; at 8k the shares are longer anyway).
  int attention_min_chunk_ = 64;
  // GYRE_CUDA_ATTN_MERGE=online: the contiguous decode attention's last block always merges
  // online (else by weights past 16 shares, attention_share.cuh).
  int attention_weighted_from_ = 16;
  uint64_t graph_replays_ = 0;
  bool synthetic_ = false;
  uint64_t synthetic_seed_ = 0;
  int synthetic_part_bits_ = 0;
  bool synthetic_trellis_ = false;
  size_t weight_bytes_ = 0, kv_bytes_ = 0, scratch_bytes_ = 0;
  std::shared_ptr<PagedStep> paged_step_;
  // The device arrays of bucketed decode steps, one set per bucket (fixed addresses: records
  // read them), by row count.
  std::vector<std::pair<int, std::shared_ptr<PagedStep>>> bucket_steps_;
};

}  // namespace gyre::cuda
