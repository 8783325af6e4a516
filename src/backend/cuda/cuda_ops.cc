// CudaBackend ops: shape checks on the host, then one or two asynchronous kernel launches
// (kernels in the .cu files of this folder, cuBLAS for prefill GEMMs).
#include <algorithm>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_buffers.h"
#include "backend/cuda/qlinear.h"
#include "backend/cuda/qmixed_device.h"

namespace gyre::cuda {

namespace {

half* h(Tensor& t) {
  return static_cast<half*>(t.data);
}
const half* h(const Tensor& t) {
  return static_cast<const half*>(t.data);
}

void check_act(const Tensor& t, const char* what) {
  GYRE_CHECK(t.dtype == DType::F16 && t.data != nullptr, "CUDA ", what,
             ": expected an FP16 device tensor");
}

// Below this many queries the split kernel (attention.cu) keeps more blocks busy.
constexpr int kFlashMinQueries = 16;

void check_same(const Tensor& a, const Tensor& b, const char* what) {
  check_act(a, what);
  check_act(b, what);
  GYRE_CHECK(a.rows == b.rows && a.cols == b.cols, "CUDA ", what, ": shapes [", a.rows, ", ",
             a.cols, "] and [", b.rows, ", ", b.cols, "] differ");
}

}  // namespace

void CudaBackend::embed(Tensor& out, const Tensor& table, const int32_t* tokens, int n) {
  check_act(out, "embed");
  check_act(table, "embed");
  GYRE_CHECK(out.rows >= n && out.cols == table.cols, "CUDA embed: bad shapes");
  for (int i = 0; i < n; ++i)
    GYRE_CHECK(tokens[i] >= 0 && tokens[i] < table.rows, "token id ", tokens[i],
               " is outside the embedding table of ", table.rows);
  const int32_t* dev_tokens = stage(tokens_, tokens, n);
  cuda::embed(h(out), h(table), dev_tokens, n, static_cast<int>(table.cols), stream_);
}

void CudaBackend::rmsnorm(Tensor& out, const Tensor& x, const Tensor& w, float eps) {
  check_same(out, x, "rmsnorm");
  check_act(w, "rmsnorm");
  GYRE_CHECK(w.rows * w.cols == x.cols, "CUDA rmsnorm: weight of ", w.rows * w.cols,
             " for rows of ", x.cols);
  cuda::rmsnorm(h(out), nullptr, h(x), h(w), x.rows, static_cast<int>(x.cols), eps, stream_);
}

void CudaBackend::add_rmsnorm(Tensor& residual, Tensor& out, const Tensor& delta, const Tensor& w,
                              float eps) {
  check_same(residual, out, "add_rmsnorm");
  check_same(residual, delta, "add_rmsnorm");
  check_act(w, "add_rmsnorm");
  GYRE_CHECK(w.rows * w.cols == residual.cols, "CUDA add_rmsnorm: bad weight size");
  cuda::rmsnorm(h(out), h(residual), h(delta), h(w), residual.rows, static_cast<int>(residual.cols),
                eps, stream_);
}

void CudaBackend::matmul(Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias) {
  check_act(out, "matmul");
  check_act(x, "matmul");
  GYRE_CHECK(att_permuted_.x != x.data, "internal: a permuted attention output outside matmul_add");
  GYRE_CHECK(x.cols == w.cols && out.cols == w.rows && out.rows == x.rows, "CUDA matmul: x [",
             x.rows, ", ", x.cols, "] . w [", w.rows, ", ", w.cols, "] -> out [", out.rows, ", ",
             out.cols, "]");
  const half* b = nullptr;
  if (bias) {
    check_act(*bias, "matmul bias");
    GYRE_CHECK(bias->rows * bias->cols == out.cols, "CUDA matmul: bias size mismatch");
    b = h(*bias);
  }
  const int n = static_cast<int>(x.rows), o = static_cast<int>(w.rows),
            in = static_cast<int>(w.cols);
  const half* xr = rotated_input(w, h(x), n);  // x, or R^T x for a rotated weight
  if (is_mixed_tensor(w)) {
    mixed_matmul(qmixed_of(w), xr, h(out), n, b);
    return;
  }
  if (is_quantized_tensor(w)) {
    // qlinear's GEMV / batch kernel up to kQlinearBatchMaxRows rows (one pass over the weight);
    // longer prefills dequantize the weight into a scratch buffer and use cuBLAS (measured on
    // H100, Llama-3-8B shape: the qlinear WMMA GEMM prefilled 2048 tokens at ~12k tok/s against
    // ~30k for FP16 cuBLAS).
    if (n < kDequantGemmMinRows && qlinear_runs_direct(qweight_of(w), n)) {
      qlinear_matmul(qweight_of(w), xr, h(out), n, b, stream_);
      return;
    }
  }
  const half* w_f16 = dense_weight(w, xr, n);
  if (n <= kGemvMaxRows) {
    gemv(h(out), xr, w_f16, b, n, o, in, stream_);
    return;
  }
  // Row-major out[n, o] = x[n, in] . w[o, in]^T is column-major out^T = w^T(op T) . x.
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t st = cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, o, n, in, &alpha, w_f16,
                                         CUDA_R_16F, in, xr, CUDA_R_16F, in, &beta, out.data,
                                         CUDA_R_16F, o, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  GYRE_CHECK(st == CUBLAS_STATUS_SUCCESS, "cuBLAS GEMM failed (status ", static_cast<int>(st),
             ") for [", n, ", ", in, "] x [", o, ", ", in, "]");
  if (b) add_bias(h(out), b, n, o, stream_);
}

void CudaBackend::rope(Tensor& x, int n_heads, int head_dim, const int32_t* positions,
                       const RopeTable& table) {
  rope_launch(x, n_heads, nullptr, 0, head_dim, positions, table);
}

void CudaBackend::rope_qk(Tensor& q, int n_heads, Tensor& k, int n_kv_heads, int head_dim,
                          const int32_t* positions, const RopeTable& table) {
  rope_launch(q, n_heads, &k, n_kv_heads, head_dim, positions, table);
}

void CudaBackend::rope_launch(Tensor& x, int n_heads, Tensor* x2, int n_heads2, int head_dim,
                              const int32_t* positions, const RopeTable& table) {
  check_act(x, "rope");
  GYRE_CHECK(static_cast<int64_t>(n_heads) * head_dim == x.cols, "CUDA rope: ", n_heads, " x ",
             head_dim, " does not match a row of ", x.cols);
  if (x2 != nullptr) {
    check_act(*x2, "rope");
    GYRE_CHECK(static_cast<int64_t>(n_heads2) * head_dim == x2->cols && x2->rows == x.rows,
               "CUDA rope: the second tensor [", x2->rows, ", ", x2->cols, "] is not ", x.rows,
               " rows of ", n_heads2, " x ", head_dim);
  }
  GYRE_CHECK(table.rot_dim > 0 && table.rot_dim <= head_dim && table.rot_dim % 2 == 0 &&
                 static_cast<int>(table.inv_freq.size()) >= table.rot_dim / 2,
             "CUDA rope: bad rotary table (rot_dim ", table.rot_dim, ")");
  const float* inv_freq = rope_table(table.inv_freq);
  const int32_t* dev_pos = stage(positions_, positions, static_cast<int>(x.rows));
  RopeArgs a;
  a.n_tokens = static_cast<int>(x.rows);
  a.n_heads = n_heads;
  a.n_heads2 = x2 != nullptr ? n_heads2 : 0;
  a.head_dim = head_dim;
  a.rot_dim = table.rot_dim;
  a.interleaved = table.interleaved;
  a.attn_factor = table.attn_factor;
  cuda::rope(h(x), x2 != nullptr ? h(*x2) : nullptr, dev_pos, inv_freq, a, stream_);
}

// Device copies of the rotary tables seen, found by content: several models may share the
// backend, and dynamic NTK scaling makes a new table per step (the oldest are dropped then).
const float* CudaBackend::rope_table(const std::vector<float>& inv_freq) {
  for (const auto& [host, dev] : rope_tables_)
    if (host == inv_freq) return static_cast<const float*>(dev.get());
  GYRE_CHECK(!capturing_, "internal: new rotary table while capturing a CUDA graph");
  constexpr size_t kMaxTables = 8;
  if (rope_tables_.size() >= kMaxTables) {
    drop_graph();  // a recorded step may read the table dropped here
    GYRE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    rope_tables_.erase(rope_tables_.begin());
  }
  const size_t bytes = inv_freq.size() * sizeof(float);
  auto dev = device_alloc(bytes, "the rotary table");
  GYRE_CUDA_CHECK(
      cudaMemcpyAsync(dev.get(), inv_freq.data(), bytes, cudaMemcpyHostToDevice, stream_));
  GYRE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  rope_tables_.emplace_back(inv_freq, dev);
  return static_cast<const float*>(dev.get());
}

RopeStoreArgs rope_store_args(half* q, const Tensor& k, const Tensor& v, const KvStoreArgs& store,
                              const RopeTable& table, const float* inv_freq, int n_heads) {
  RopeStoreArgs r;
  r.q = q;
  r.k = h(k);
  r.v = h(v);
  r.store = store;
  r.inv_freq = inv_freq;
  r.n_heads = n_heads;
  r.rot_dim = table.rot_dim;
  r.interleaved = table.interleaved;
  r.attn_factor = table.attn_factor;
  return r;
}

const float* CudaBackend::checked_rope_table(const RopeTable& rope, int head_dim) {
  GYRE_CHECK(rope.rot_dim > 0 && rope.rot_dim <= head_dim && rope.rot_dim % 2 == 0 &&
                 static_cast<int>(rope.inv_freq.size()) >= rope.rot_dim / 2,
             "CUDA rope: bad rotary table (rot_dim ", rope.rot_dim, ")");
  return rope_table(rope.inv_freq);
}

void CudaBackend::attention(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                            KvCache& cache, int layer, int pos0, const AttentionParams& p) {
  attend(out, q, k, v, cache, layer, pos0, p, nullptr);
}

void CudaBackend::rope_attention(Tensor& out, Tensor& q, Tensor& k, const Tensor& v, KvCache& cache,
                                 int layer, int pos0, const AttentionParams& p,
                                 const RopeTable& table, const Tensor* reader) {
  if (!fused_rope_store_) {
    att_permuted_ = {};
    Backend::rope_attention(out, q, k, v, cache, layer, pos0, p, table);
    return;
  }
  check_act(q, "rope_attention");
  attend(out, q, k, v, cache, layer, pos0, p, &table, reader);
}

void CudaBackend::attend(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                         KvCache& cache, int layer, int pos0, const AttentionParams& p,
                         const RopeTable* rope, const Tensor* reader) {
  att_permuted_ = {};
  auto* c = dynamic_cast<CudaKvCache*>(&cache);
  GYRE_CHECK(c != nullptr, "CUDA attention: the KV cache is not a CUDA cache");
  check_same(out, q, "attention");
  check_same(k, v, "attention");
  const int n = static_cast<int>(q.rows);
  GYRE_CHECK(p.n_kv_heads == c->n_kv_heads && p.head_dim == c->head_dim && layer >= 0 &&
                 layer < c->n_layers,
             "CUDA attention: parameters do not match the KV cache");
  GYRE_CHECK(q.cols == static_cast<int64_t>(p.n_heads) * p.head_dim &&
                 k.cols == static_cast<int64_t>(p.n_kv_heads) * p.head_dim && k.rows == n,
             "CUDA attention: q/k/v widths do not match the head counts");
  GYRE_CHECK(pos0 >= 0 && pos0 + n <= c->max_seq(), "attention at positions ", pos0, "..", pos0 + n,
             " exceeds the KV cache of ", c->max_seq());
  // Before the staging: a new rotary table synchronizes the stream once.
  const float* inv_freq = rope ? checked_rope_table(*rope, p.head_dim) : nullptr;
  const int32_t* dev_pos0 = stage(pos0_, &pos0, 1);
  KvStoreArgs st;
  st.k_codes = c->codes(layer, 0);
  st.v_codes = c->codes(layer, 1);
  st.k_params = c->params(layer, 0);
  st.v_params = c->params(layer, 1);
  st.kv_type = static_cast<int>(c->type);
  st.n = n;
  st.n_kv_heads = p.n_kv_heads;
  st.head_dim = p.head_dim;
  st.max_seq = c->max_seq();
  AttentionArgs a;
  if (rope)  // q is the caller's non-const tensor (rope_attention)
    a.rope = rope_store_args(static_cast<half*>(q.data), k, v, st, *rope, inv_freq, p.n_heads);
  a.q = h(q);
  a.k_cache = st.k_codes;
  a.v_cache = st.v_codes;
  a.k_params = st.k_params;
  a.v_params = st.v_params;
  a.kv_type = st.kv_type;
  a.out = h(out);
  a.pos0 = dev_pos0;
  a.n_q = n;
  a.n_heads = p.n_heads;
  a.n_kv_heads = p.n_kv_heads;
  a.head_dim = p.head_dim;
  a.max_seq = c->max_seq();
  a.window = p.sliding_window;
  a.scale = p.scale;
  auto store = [&] {
    if (rope)
      rope_kv_store(a.rope, dev_pos0, stream_);
    else
      kv_store(st, h(k), h(v), dev_pos0, stream_);
  };
  // Many queries (prefill) of a common head size: the tensor-core kernel.
  if (n >= kFlashMinQueries && flash_prefill_supported(p.head_dim)) {
    store();
    flash_prefill(a, stream_);
    return;
  }
  // The count depends only on shapes (not on the position), so a captured decode step stays
  // valid as the context grows. A decode step may rotate and store inside the attention kernel
  // (GYRE_CUDA_ROPE_IN_ATTENTION=0: never), which changes its occupancy.
  const bool try_fuse = rope != nullptr && n == 1 && rope_in_attention_;
  a.splits = attention_splits(n, p.n_heads, p.n_kv_heads, p.head_dim, a.kv_type, c->max_seq(),
                              sm_count_, false, try_fuse);
  a.partial = workspace(attention_workspace_floats(n, p.n_heads, p.head_dim, a.splits));
  set_split_combine(a, attention_counters(n, p.n_heads, p.n_kv_heads));
  a.min_chunk = attention_min_chunk_;
  a.weighted_from = attention_weighted_from_;
  a.fuse_rope = try_fuse && attention_fuses_rope(a);
  // An act-order o_proj next (reader): the output in its column order, so that its GEMV stages
  // x plainly (its scatter staging cost the step 3.5 us per layer: bench/NOTES.md, session 17).
  const QWeightDevice* o =
      reader != nullptr && is_quantized_tensor(*reader) ? &qweight_of(*reader) : nullptr;
  if (permuted_residual_enabled_ && a.fuse_rope && o != nullptr && o->perm != nullptr &&
      o->inv_perm != nullptr && reader->cols == out.cols && adds_directly(*reader, n))
    a.out_index = o->inv_perm;
  // A mixed o_proj: the output in its decode row (no gather before its parts).
  const QMixedDevice* row = a.fuse_rope ? row_reader(reader, out, n) : nullptr;
  if (row != nullptr) {
    a.out = row->row;
    a.out_index = row->pos;
  }
  if (!a.fuse_rope) store();
  cuda::attention(a, stream_);
  if (row != nullptr)
    att_permuted_ = {out.data, n, row->pos};
  else if (a.out_index != nullptr)
    att_permuted_ = {out.data, n, o->perm};
}

void CudaBackend::silu_mul(Tensor& out, const Tensor& gate, const Tensor& up) {
  check_same(out, gate, "silu_mul");
  check_same(gate, up, "silu_mul");
  cuda::silu_mul(h(out), h(gate), h(up), out.rows * out.cols, stream_);
}

void CudaBackend::add(Tensor& x, const Tensor& y) {
  check_same(x, y, "add");
  cuda::add(h(x), h(y), x.rows * x.cols, stream_);
}

}  // namespace gyre::cuda
