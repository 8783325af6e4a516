#include "engine/transformer.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "core/diag.h"
#include "core/error.h"
#include "engine/mlp_order.h"

namespace gyre {

namespace {
size_t tensor_bytes(const Tensor& t) {
  return static_cast<size_t>(t.rows) * t.row_bytes();
}
}  // namespace

Transformer::Transformer(const ModelConfig& config, const WeightSet& weights, Backend& backend,
                         int max_seq, bool single_sequence_cache)
    : config_(config), backend_(backend), max_seq_(max_seq) {
  config_validate(config_);
  weights_validate(weights, config_);
  GYRE_CHECK(max_seq_ > 0, "max sequence length must be positive");
  auto up_view = [&](const TensorView& v) {
    Tensor t = backend_.upload_weight(v);
    weight_bytes_ += tensor_bytes(t);
    return t;
  };
  auto up = [&](const std::string& name) { return up_view(weights.get(name)); };
  embed_ = up("model.embed_tokens.weight");
  final_norm_ = up("model.norm.weight");
  if (config_.tie_embeddings || !weights.has("lm_head.weight"))
    lm_head_ = embed_;
  else
    lm_head_ = up("lm_head.weight");
  layers_.resize(static_cast<size_t>(config_.n_layers));
  for (int i = 0; i < config_.n_layers; ++i) {
    auto name = [i](const char* s) { return layer_tensor(i, s); };
    Layer& l = layers_[static_cast<size_t>(i)];
    l.attn_norm = up(name("input_layernorm.weight"));
    l.ffn_norm = up(name("post_attention_layernorm.weight"));
    // Q|K|V and gate|up are fused: one pass over the shared input each (matmul_split/_swiglu).
    auto fused_views = [&](const std::vector<TensorView>& parts, FusedKind kind) {
      Tensor t = backend_.upload_fused(parts, kind);
      weight_bytes_ += tensor_bytes(t);
      return t;
    };
    auto fused = [&](std::vector<std::string> names, FusedKind kind) {
      std::vector<TensorView> parts;
      for (const std::string& n : names) parts.push_back(weights.get(n));
      return fused_views(parts, kind);
    };
    const char* qkv[] = {"self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj."};
    auto qkv_names = [&](const char* suffix) {
      std::vector<std::string> v;
      for (const char* p : qkv) v.push_back(name((std::string(p) + suffix).c_str()));
      return v;
    };
    l.wqkv = fused(qkv_names("weight"), FusedKind::Concat);
    l.wo = up(name("self_attn.o_proj.weight"));
    if (config_.qkv_bias) l.bqkv = fused(qkv_names("bias"), FusedKind::Concat);
    const std::string gate = name("mlp.gate_proj.weight"), upn = name("mlp.up_proj.weight"),
                      down = name("mlp.down_proj.weight");
    // The rewritten weights live until the end of this iteration: the backend copies them.
    std::optional<MlpInDownOrder> reordered;
    if (backend_.wants_mlp_in_down_order())
      reordered = mlp_in_down_order(weights.get(gate), weights.get(upn), weights.get(down));
    if (reordered) {
      l.w_gate_up = fused_views(reordered->gate_up_views(gate, upn), FusedKind::GateUp);
      l.w_down = up_view(reordered->down_view(down));
    } else {
      l.w_gate_up = fused({gate, upn}, FusedKind::GateUp);
      l.w_down = up(down);
    }
  }
  rope_.rot_dim = config_.rope.rot_dim > 0 ? config_.rope.rot_dim : config_.head_dim;
  rope_.interleaved = config_.rope.interleaved;
  rope_.inv_freq = rope_inv_freq(config_.rope, config_.max_seq_len, 0);
  rope_.attn_factor = rope_attention_factor(config_.rope, config_.max_seq_len);
  if (single_sequence_cache)
    cache_ =
        backend_.new_kv_cache(config_.n_layers, config_.n_kv_heads, config_.head_dim, max_seq_);
}

void Transformer::ensure_scratch(int n) {
  if (n <= scratch_rows_) return;
  const ModelConfig& c = config_;
  x_ = backend_.alloc(n, c.dim);
  xn_ = backend_.alloc(n, c.dim);
  q_ = backend_.alloc(n, c.q_dim());
  k_ = backend_.alloc(n, c.kv_dim());
  v_ = backend_.alloc(n, c.kv_dim());
  att_ = backend_.alloc(n, c.q_dim());
  gate_ = backend_.alloc(n, c.hidden_dim);
  ffn_ = backend_.alloc(n, c.dim);
  logits_ = backend_.alloc(n, c.vocab_size);
  scratch_rows_ = n;
}

AttentionParams Transformer::attention_params() const {
  const ModelConfig& c = config_;
  AttentionParams ap;
  ap.n_heads = c.n_heads;
  ap.n_kv_heads = c.n_kv_heads;
  ap.head_dim = c.head_dim;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  ap.sliding_window = c.sliding_window;
  return ap;
}

template <typename Attend>
bool Transformer::run_layers(const int32_t* tokens, int n, Attend&& attend, const Tensor* head) {
  const ModelConfig& c = config_;
  Tensor x = x_.slice_rows(0, n), xn = xn_.slice_rows(0, n), q = q_.slice_rows(0, n),
         k = k_.slice_rows(0, n), v = v_.slice_rows(0, n), att = att_.slice_rows(0, n),
         gate = gate_.slice_rows(0, n), ffn = ffn_.slice_rows(0, n);
  backend_.embed(x, embed_, tokens, n);
  // Decode on a backend that folds the norms into the matmuls: no norm kernels between them
  // (each matmul adds into the residual x, the next one normalises x as it reads it).
  const bool fuse =
      backend_.fuses_norms(n, layers_[0].wqkv) && backend_.fuses_norms(n, layers_[0].w_gate_up);
  if (!fuse) backend_.rmsnorm(xn, x, layers_[0].attn_norm, c.norm_eps);
  // The head normalises x itself where it can (GYRE_DIAG_SKIP=headnorm: the separate norm).
  const bool head_norms =
      fuse && head != nullptr && backend_.fuses_norms(n, *head) && !diag_skip("headnorm");
  for (size_t li = 0; li < layers_.size(); ++li) {
    Layer& l = layers_[li];
    const Tensor* bqkv = c.qkv_bias ? &l.bqkv : nullptr;
    if (fuse) {
      backend_.norm_matmul_split({&q, &k, &v}, {x, l.attn_norm, c.norm_eps, xn}, l.wqkv, bqkv);
    } else {
      backend_.matmul_split({&q, &k, &v}, xn, l.wqkv, bqkv);
    }
    attend(att, q, k, v, static_cast<int>(li), fuse ? &l.wo : nullptr);  // reader: o_proj's add
    if (fuse) {
      // Each residual add names the weight that reads the residual next (Backend::matmul_add).
      backend_.matmul_add(x, att, l.wo, ffn, &l.w_gate_up);
      backend_.norm_matmul_swiglu(gate, {x, l.ffn_norm, c.norm_eps, xn}, l.w_gate_up, &l.w_down);
      backend_.matmul_add(
          x, gate, l.w_down, ffn,
          li + 1 < layers_.size() ? &layers_[li + 1].wqkv : (head_norms ? head : nullptr));
      continue;
    }
    backend_.matmul(ffn, att, l.wo, nullptr);
    backend_.add_rmsnorm(x, xn, ffn, l.ffn_norm, c.norm_eps);
    backend_.matmul_swiglu(gate, xn, l.w_gate_up);
    backend_.matmul(ffn, gate, l.w_down, nullptr);
    const Tensor& next_norm = li + 1 < layers_.size() ? layers_[li + 1].attn_norm : final_norm_;
    backend_.add_rmsnorm(x, xn, ffn, next_norm, c.norm_eps);
  }
  if (n == 1 && diag_skip("head")) return head_norms;  // timing only: no final norm or head
  if (fuse && !head_norms) backend_.rmsnorm(xn, x, final_norm_, c.norm_eps);  // the head reads xn
  return head_norms;
}

void Transformer::run_ops(const int32_t* tokens, int n, int pos, bool all_logits) {
  const AttentionParams ap = attention_params();
  const bool head_norms = run_layers(
      tokens, n,
      [&](Tensor& att, Tensor& q, Tensor& k, Tensor& v, int layer, const Tensor* reader) {
        backend_.rope_attention(att, q, k, v, *cache_, layer, pos, ap, rope_, reader);
      },
      n == 1 ? &lm_head_ : nullptr);
  if (n == 1 && diag_skip("head")) return;
  const int first = all_logits ? 0 : n - 1;
  const int rows = n - first;
  Tensor out = logits_.slice_rows(0, rows);
  if (head_norms) {  // one row: the final norm inside the head's matmul
    Tensor x = x_.slice_rows(0, 1), xn = xn_.slice_rows(0, 1);
    backend_.norm_matmul_split({&out}, {x, final_norm_, config_.norm_eps, xn}, lm_head_, nullptr);
  } else {
    backend_.matmul(out, xn_.slice_rows(first, rows), lm_head_, nullptr);
  }
}

namespace {
// The records of fed decode steps (Backend::fed_steps_begin), by how they pick.
constexpr int kFedGreedyBucket = -1, kFedSampledBucket = -2;
}  // namespace

int Transformer::decode_fed(int token, int pos, int max_steps,
                            const std::function<SampleRequest()>& next_request,
                            const std::function<bool(int)>& take) {
  const ModelConfig& c = config_;
  GYRE_CHECK(cache_ != nullptr, "this model was loaded for batched serving only");
  GYRE_CHECK(max_steps >= 0 && pos >= 0 && max_steps <= max_seq_ - pos, "sequence of ",
             int64_t{pos} + max_steps, " tokens exceeds the context of ", max_seq_);
  GYRE_CHECK(token >= 0 && token < c.vocab_size, "token id ", token,
             " is outside the vocabulary of ", c.vocab_size);
  if (max_steps == 0) return 0;
  SampleRequest request = next_request();
  GYRE_CHECK(!request.has_penalties(), "decode_fed: penalties need each pick's history");
  const bool fed = backend_.graph_capable() && c.rope.scaling != RopeScaling::DynamicNtk &&
                   backend_.fed_steps_begin(token, pos, request);
  if (!fed) {
    for (int i = 0; i < max_steps; ++i) {
      if (i > 0) request = next_request();
      forward(&token, 1, pos + i, nullptr, false);
      SampleResult picked;
      sample_logits(&request, 1, &picked);
      GYRE_CHECK(picked.error.empty(), picked.error);
      token = picked.id;
      if (!take(token)) return i + 1;
    }
    return max_steps;
  }
  const int bucket = request.temperature > 0.0f ? kFedSampledBucket : kFedGreedyBucket;
  int launched = 0, taken = 0;
  try {
    ensure_scratch(1);
    for (bool more = true; more && taken < max_steps;) {
      for (; launched < max_steps && launched - taken < kFedAhead; ++launched) {
        const int p = pos + launched;
        if (launched > 0) request = next_request();
        backend_.fed_stage(p, request);
        run_recorded(bucket, [&] {
          run_ops(&token, 1, p, false);  // the token and position come from the device
          backend_.fed_pick(logits_.slice_rows(0, 1));
        });
        backend_.fed_step_launched(p);
      }
      more = take(backend_.fed_result(pos + taken++));
    }
  } catch (...) {
    backend_.fed_steps_end();
    throw;
  }
  backend_.fed_steps_end();
  logit_rows_ = 1;
  return taken;
}

void Transformer::forward(const int32_t* tokens, int n, int pos, float* logits, bool all_logits) {
  const ModelConfig& c = config_;
  GYRE_CHECK(cache_ != nullptr, "this model was loaded for batched serving only");
  GYRE_CHECK(n > 0, "forward pass over zero tokens");
  // Compared as n <= max_seq_ - pos: pos + n could overflow for a hostile pos.
  GYRE_CHECK(pos >= 0 && n <= max_seq_ - pos, "sequence of ", int64_t{pos} + n,
             " tokens exceeds the context of ", max_seq_);
  for (int i = 0; i < n; ++i)
    GYRE_CHECK(tokens[i] >= 0 && tokens[i] < c.vocab_size, "token id ", tokens[i],
               " is outside the vocabulary of ", c.vocab_size);
  if (c.rope.scaling == RopeScaling::DynamicNtk)
    rope_.inv_freq = rope_inv_freq(c.rope, c.max_seq_len, pos + n);
  ensure_scratch(n);
  std::vector<int32_t> positions(static_cast<size_t>(n));
  std::iota(positions.begin(), positions.end(), pos);

  // Single-token decode steps replay a recorded graph when the backend has one. Dynamic NTK
  // changes the rotary table every step, so it never records.
  auto ops = [&] { run_ops(tokens, n, pos, all_logits); };
  if (n == 1 && backend_.graph_capable() && c.rope.scaling != RopeScaling::DynamicNtk) {
    backend_.stage_step_inputs(tokens, positions.data(), n, pos);
    run_recorded(0, ops);
  } else {
    ops();
  }
  const int first = all_logits ? 0 : n - 1;
  logit_rows_ = n - first;
  if (logits) backend_.to_host(logits_.slice_rows(0, logit_rows_), logits);
}

template <typename Ops>
void Transformer::run_recorded(int bucket, Ops&& ops) {
  if (backend_.replay_step(this, bucket)) return;
  if (std::find(warm_buckets_.begin(), warm_buckets_.end(), bucket) == warm_buckets_.end()) {
    ops();
    warm_buckets_.push_back(bucket);
    return;
  }
  backend_.capture_begin(this, bucket);
  bool recorded = false;
  try {
    ops();
    recorded = true;
  } catch (...) {  // below
  }
  try {
    backend_.capture_end(recorded);
  } catch (...) {
    recorded = false;
  }
  // Recording can fail where a buffer must grow first (another step outgrew it since this one's
  // warm run) or an op cannot be recorded: nothing ran, so the step runs eagerly now (and is
  // recorded next time). A real error repeats here and propagates.
  if (!recorded) {
    ops();
    return;
  }
  GYRE_CHECK(backend_.replay_step(this, bucket),
             "internal: recorded decode step cannot be replayed");
}

std::unique_ptr<PagedKvCache> Transformer::new_paged_kv_cache(int num_pages, int page_size) {
  return backend_.new_paged_kv_cache(config_.n_layers, config_.n_kv_heads, config_.head_dim,
                                     num_pages, page_size);
}

void Transformer::forward_batch(const int32_t* tokens, const PagedBatch& batch, PagedKvCache& kv,
                                const int32_t* logit_rows, int n_logit_rows, float* logits) {
  const ModelConfig& c = config_;
  const int n = batch.rows;
  GYRE_CHECK(n > 0, "batched forward pass over zero tokens");
  for (int i = 0; i < n; ++i) {
    GYRE_CHECK(tokens[i] >= 0 && tokens[i] < c.vocab_size, "token id ", tokens[i],
               " is outside the vocabulary of ", c.vocab_size);
    GYRE_CHECK(batch.positions[i] >= 0 && batch.positions[i] < max_seq_, "position ",
               batch.positions[i], " exceeds the context of ", max_seq_);
  }
  for (int i = 0; i < n_logit_rows; ++i)
    GYRE_CHECK(
        logit_rows[i] >= 0 && logit_rows[i] < n && (i == 0 || logit_rows[i] > logit_rows[i - 1]),
        "logit rows must be ascending rows of the batch");
  if (c.rope.scaling == RopeScaling::DynamicNtk) {
    // One table per step: the longest context of the batch sets the scaling (an approximation
    // for the shorter ones, as the single-sequence path already is for cached keys).
    int longest = 0;
    for (int s = 0; s < batch.seqs; ++s) longest = std::max(longest, batch.context_lens[s]);
    rope_.inv_freq = rope_inv_freq(c.rope, c.max_seq_len, longest);
  }
  // Decode-only steps (every sequence one row) may run padded to a bucket (a recorded graph per
  // bucket); the rest, and dynamic NTK (a new rotary table per step), run as they are.
  bool decode_only = batch.rows == batch.seqs && batch.seq_starts != nullptr && !batch.bucketed &&
                     c.rope.scaling != RopeScaling::DynamicNtk;
  for (int s = 0; decode_only && s <= batch.seqs; ++s) decode_only = batch.seq_starts[s] == s;
  const int bucket = decode_only ? backend_.decode_bucket(n) : 0;
  if (bucket >= n) {
    forward_decode_bucket(tokens, batch, kv, bucket);
  } else {
    const AttentionParams ap = attention_params();
    ensure_scratch(n);
    run_layers(
        tokens, n,
        [&](Tensor& att, Tensor& q, Tensor& k, Tensor& v, int layer, const Tensor* /*reader*/) {
          backend_.rope_attention_paged(att, q, k, v, kv, layer, batch, ap, rope_);
        });
  }
  logit_rows_ = n_logit_rows;
  if (n_logit_rows == 0) return;
  // The lm head runs on consecutive runs of wanted rows (the decodes of a step are one run), so
  // no gather op is needed and no unwanted row pays for the vocabulary projection.
  Tensor out_all = logits_.slice_rows(0, n_logit_rows);
  for (int i = 0; i < n_logit_rows;) {
    int j = i + 1;
    while (j < n_logit_rows && logit_rows[j] == logit_rows[j - 1] + 1) ++j;
    Tensor out = out_all.slice_rows(i, j - i);
    backend_.matmul(out, xn_.slice_rows(logit_rows[i], j - i), lm_head_, nullptr);
    i = j;
  }
  if (logits) backend_.to_host(out_all, logits);
}

void Transformer::sample_logits(const SampleRequest* requests, int n, SampleResult* out) {
  GYRE_CHECK(n >= 0 && n <= logit_rows_, "sampling ", n, " rows, but the last forward pass made ",
             logit_rows_);
  backend_.sample(logits_.slice_rows(0, n), requests, n, out);
}

void Transformer::forward_decode_bucket(const int32_t* tokens, const PagedBatch& batch,
                                        PagedKvCache& kv, int bucket) {
  const int n = batch.rows;
  // Page tables of one width for every step of the model (launch shapes must not change between
  // replays): enough pages for max_seq_ positions, which every decode row is below.
  const int ps = kv.page_size();
  const int width = (max_seq_ + ps - 1) / ps;
  const int copied = std::min(batch.max_pages, width);
  std::vector<int32_t> padded_tokens(tokens, tokens + n),
      positions(batch.positions, batch.positions + n);
  std::vector<int64_t> slots(batch.slots, batch.slots + n);
  padded_tokens.resize(static_cast<size_t>(bucket), 0);  // padding rows: any valid token
  positions.resize(static_cast<size_t>(bucket), 0);
  slots.resize(static_cast<size_t>(bucket), -1);  // the backend sends them to its scratch slot
  std::vector<int32_t> tables(static_cast<size_t>(n) * width, -1);
  for (int s = 0; s < n; ++s)
    std::copy_n(batch.page_tables + static_cast<size_t>(s) * batch.max_pages, copied,
                tables.begin() + static_cast<ptrdiff_t>(s) * width);
  PagedBatch pb = batch;
  pb.rows = bucket;
  pb.positions = positions.data();
  pb.slots = slots.data();
  pb.page_tables = tables.data();
  pb.max_pages = width;
  pb.bucketed = true;
  pb.padding_rows = bucket - n;

  ensure_scratch(bucket);
  backend_.stage_paged_step(pb, kv);
  const AttentionParams ap = attention_params();
  auto ops = [&] {
    run_layers(
        padded_tokens.data(), bucket,
        [&](Tensor& att, Tensor& q, Tensor& k, Tensor& v, int layer, const Tensor* /*reader*/) {
          backend_.rope_attention_paged(att, q, k, v, kv, layer, pb, ap, rope_);
        });
  };
  if (backend_.graph_capable()) {
    backend_.stage_step_inputs(padded_tokens.data(), positions.data(), bucket, 0);
    run_recorded(bucket, ops);
  } else {
    ops();
  }
}

}  // namespace gyre
