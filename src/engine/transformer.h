// One Llama-family forward pass over the Backend interface: the same code for every family
// (differences come from ModelConfig) and every backend.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/weights.h"

namespace gyre {

class Transformer {
 public:
  // Uploads the weights to the backend; max_seq bounds the KV cache. Without
  // single_sequence_cache (serving: forward_batch only) no single-sequence cache is allocated.
  Transformer(const ModelConfig& config, const WeightSet& weights, Backend& backend, int max_seq,
              bool single_sequence_cache = true);

  // Runs tokens [n] at positions pos, pos+1, ... (continuing the cached sequence).
  // logits: host buffer of vocab floats per requested row: only the last token's row when
  // all_logits is false, every token's when true. nullptr: the logits stay on the backend for
  // sample_logits().
  void forward(const int32_t* tokens, int n, int pos, float* logits, bool all_logits);

  // A paged KV cache for forward_batch (backend's new_paged_kv_cache with this model's shape).
  std::unique_ptr<PagedKvCache> new_paged_kv_cache(int num_pages, int page_size);
  // Runs one step of ragged sequences: tokens[batch.rows] at their positions, keys and values
  // written to their slots of `kv`; every row's matmuls run together. logits: vocab floats for
  // each of logit_rows (ascending row indices), in that order; nullptr: they stay on the backend
  // for sample_logits().
  void forward_batch(const int32_t* tokens, const PagedBatch& batch, PagedKvCache& kv,
                     const int32_t* logit_rows, int n_logit_rows, float* logits);
  // Samples the logits rows of the last forward / forward_batch on the backend (row i with
  // requests[i]; n at most the rows it made), so only ids and log-probabilities reach the host.
  void sample_logits(const SampleRequest* requests, int n, SampleResult* out);
  // Decode of up to max_steps tokens: the first step reads `token` at `pos`; each step's token is
  // picked as next_request() says (called once per step, in order, before the step runs; greedy
  // or sampled with the request's own draw, never penalties: those need each pick's history) and
  // take(id) gets the picks in order and returns false to stop. Returns the number taken. Where
  // the backend feeds steps (Backend::fed_steps_begin), each pick becomes the next step's input
  // on the device and the host runs up to kFedAhead steps ahead of the ids it has taken; steps
  // run past a stop write keys and values beyond the taken ones, which the next forward pass at
  // those positions overwrites. Elsewhere: forward and sample_logits per step. The logits
  // afterwards are the last step's.
  int decode_fed(int token, int pos, int max_steps,
                 const std::function<SampleRequest()>& next_request,
                 const std::function<bool(int)>& take);
  int decode_greedy(int token, int pos, int max_steps, const std::function<bool(int)>& take) {
    return decode_fed(
        token, pos, max_steps, [] { return SampleRequest{}; }, take);
  }
  static constexpr int kFedAhead = 2;

  const ModelConfig& config() const { return config_; }
  int max_seq() const { return max_seq_; }
  size_t weight_bytes() const { return weight_bytes_; }
  size_t cache_bytes() const { return cache_ ? cache_->bytes() : 0; }
  Backend& backend() { return backend_; }

 private:
  struct Layer {
    Tensor attn_norm, ffn_norm, wqkv, wo, bqkv, w_gate_up, w_down;
  };
  void ensure_scratch(int n);
  AttentionParams attention_params() const;
  // Runs rows [0, n) of the scratch through every layer; attend(att, q, k, v, layer, reader)
  // applies the rotary embedding to q and k and fills att (the paged path fuses the rotation with
  // its store); reader: the weight whose matmul_add alone reads att next, or null
  // (Backend::rope_attention). head: the LM head that reads the last layer's output; where it
  // can normalise x itself (Backend::fuses_norms), no final norm runs and this returns true (the
  // head then reads x through norm_matmul_split); else xn holds the normalised rows.
  template <typename Attend>
  bool run_layers(const int32_t* tokens, int n, Attend&& attend, const Tensor* head = nullptr);
  // Every backend op of one forward pass, up to the logits in logits_ (device side).
  void run_ops(const int32_t* tokens, int n, int pos, bool all_logits);
  // Runs ops() as the backend's record for `bucket` (Backend::capture_begin): replayed when one
  // exists; else run eagerly the first time (lazy allocations happen there), recorded and
  // replayed from the second. The step's inputs must be staged already.
  template <typename Ops>
  void run_recorded(int bucket, Ops&& ops);
  // forward_batch of a decode step (every sequence one row) padded to `bucket` rows.
  void forward_decode_bucket(const int32_t* tokens, const PagedBatch& batch, PagedKvCache& kv,
                             int bucket);

  ModelConfig config_;
  Backend& backend_;
  int max_seq_;
  size_t weight_bytes_ = 0;
  Tensor embed_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
  RopeTable rope_;
  std::unique_ptr<KvCache> cache_;
  int scratch_rows_ = 0;
  std::vector<int> warm_buckets_;  // steps run eagerly once: the next one may be recorded
  Tensor x_, xn_, q_, k_, v_, att_, gate_, ffn_, logits_;
  int logit_rows_ = 0;  // rows of logits_ the last forward pass wrote
};

}  // namespace gyre
