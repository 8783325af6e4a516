// Shared helpers of the CUDA backend's host code and kernels: error checks that turn CUDA
// failures into gyre::Error, and the launch parameter structs of every kernel family.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/out_split.h"
#include "core/error.h"

#define GYRE_CUDA_CHECK(expr)                                                        \
  do {                                                                               \
    const cudaError_t gyre_err_ = (expr);                                            \
    if (gyre_err_ != cudaSuccess)                                                    \
      ::gyre::fail("CUDA error: ", cudaGetErrorString(gyre_err_), " (", #expr, ")"); \
  } while (0)

// After a kernel launch: reports bad launch configurations at once (not at the next sync).
#define GYRE_CUDA_LAUNCHED() GYRE_CUDA_CHECK(cudaGetLastError())

namespace gyre::cuda {

// ---- elementwise.cu ----
void embed(half* out, const half* table, const int32_t* tokens, int n, int dim, cudaStream_t s);
void add(half* x, const half* y, int64_t count, cudaStream_t s);
void silu_mul(half* out, const half* gate, const half* up, int64_t count, cudaStream_t s);
// out[t, r] = silu(g) * u for r < hidden from fused [n, fused_rows] GEMM output whose rows are
// gate/up interleaved in blocks of `block` rows (kSwigluBlock, or kTrellisSwigluBlock:
// out_split.h).
void swiglu_interleaved(half* out, const half* fused, int64_t n, int hidden, int fused_rows,
                        int block, cudaStream_t s);
// Copies fused [n, rows] into the split outputs (GEMM paths without a split epilogue).
void split_rows(const OutSplit& out, const half* fused, int64_t n, int rows, cudaStream_t s);
void add_bias(half* x, const half* bias, int64_t rows, int64_t cols, cudaStream_t s);
void half_to_float(float* dst, const half* src, int64_t count, cudaStream_t s);
// src holds `count` elements of bf16 (is_bf16) or f32 values; dst gets them as f16.
void convert_to_half(half* dst, const void* src, bool is_bf16, int64_t count, cudaStream_t s);
// Deterministic pseudo-random fill: offset + scale * u, u uniform in [-1, 1), from a hash of
// (seed, index): synthetic benchmark weights made on the GPU, never zeros.
void fill_random(half* dst, int64_t count, uint64_t seed, float scale, float offset,
                 cudaStream_t s);

// ---- rmsnorm.cu ----
// out = x / rms(x) * w per row. With residual: residual += x first, then the norm of the sum.
void rmsnorm(half* out, half* residual, const half* x, const half* w, int64_t rows, int cols,
             float eps, cudaStream_t s);

// ---- rope.cu ----
struct RopeArgs {
  int n_tokens = 0, n_heads = 0, head_dim = 0, rot_dim = 0;
  int n_heads2 = 0;  // heads of the second tensor (k of rope_qk), 0 when there is none
  bool interleaved = false;
  float attn_factor = 1.0f;
};
// x2 (may be null when a.n_heads2 == 0): a second tensor [n_tokens, n_heads2 * head_dim] rotated
// in the same launch (q and k).
void rope(half* x, half* x2, const int32_t* positions, const float* inv_freq, const RopeArgs& a,
          cudaStream_t s);

// ---- attention.cu ----
// Where kv_store writes: one layer's planes, laid out as in AttentionArgs.
struct KvStoreArgs {
  void* k_codes = nullptr;
  void* v_codes = nullptr;
  half* k_params = nullptr;
  half* v_params = nullptr;
  int kv_type = 0;
  int n = 0, n_kv_heads = 0, head_dim = 0, max_seq = 0;
};
// rope of q and k fused with the store (rope_store.cuh; the paged cache's version is in
// paged_attention.h): q [n, n_heads * head_dim] is rotated in place; k [n, n_kv_heads *
// head_dim] is rotated on its way into the cache (k itself is left as it was) and v is stored as
// it is. The rotation is rope.cu's (same f32 math, rounded to FP16 before the store), so the
// result equals rope then the store.
struct RopeStoreArgs {
  half* q = nullptr;
  const half* k = nullptr;
  const half* v = nullptr;
  KvStoreArgs store;                // planes, kv_type, n (rows), n_kv_heads, head_dim, max_seq
  const float* inv_freq = nullptr;  // [rot_dim / 2] (device)
  int n_heads = 0, rot_dim = 0;
  bool interleaved = false;
  float attn_factor = 1.0f;
};
struct AttentionArgs {
  const half* q = nullptr;  // [n_q, n_heads * head_dim]
  // This layer's keys and values: codes [n_kv_heads][max_seq][row codes] (FP16: the halves) and,
  // for q8/q4, params [n_kv_heads][max_seq][row params] (kv_quant.cuh).
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  const half* k_params = nullptr;
  const half* v_params = nullptr;
  int kv_type = 0;      // KvKind (kv_quant.cuh): 0 f16, 1 q8, 2 q4
  half* out = nullptr;  // [n_q, n_heads * head_dim]
  // Not null: each row of out in the column order of the weight that reads it (an act-order
  // o_proj), value c at column out_index[c] (its inv_perm). With fuse_rope only (a decode row).
  const int32_t* out_index = nullptr;
  float* partial = nullptr;       // split workspace: attention_workspace_floats() floats
  const int32_t* pos0 = nullptr;  // device: position of query 0
  int n_q = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, max_seq = 0;
  int window = 0;  // 0: full causal attention
  int splits = 1;  // context chunks per query, combined afterwards when > 1
  float scale = 0.0f;
  bool generic_block = false;  // split_attend for every head dim (benches comparing the blocks)
  // Combine counters, zero between launches (attention_share.cuh): the last block of a split
  // query's head group combines the partials. attention_counters() of them; null: the separate
  // combine kernel. single_span: contexts of at most this many keys take one block (counters).
  unsigned* counters = nullptr;
  int single_span = 0;
  int trigger_span = 1 << 30;  // PDL: longer contexts let the next kernel in after their keys
  int min_chunk = 32;          // the smallest share of keys (attention_share.cuh: kMinChunk)
  int weighted_from = 16;      // more shares than this: the weighted merge (attention_share.cuh)
  bool prefetch_kv = false;    // the decode block asks L2 for its keys before its PDL wait (sm_90)
  bool mma_decode = true;      // the decode block's tensor-core loop where it applies (decode_attn)
  // Decode (n_q 1, the decode block, in-kernel combine or one split): the rope.k/v row is rotated
  // and stored, and q rotated as it is loaded, by the attention kernel itself (rope_kv_store's
  // work without a launch of its own); q stays unrotated in memory. Only where
  // attention_fuses_rope().
  bool fuse_rope = false;
  RopeStoreArgs rope;
};
size_t attention_workspace_floats(int n_q, int n_heads, int head_dim, int splits);
// Counters for a split launch of n_q rows (one per row and head group of <= 8 query heads).
size_t attention_counters(int n_q, int n_heads, int n_kv_heads);
// Context shares per query row for the split kernels (contiguous and paged) of `rows` rows whose
// key ranges are at most max_span long: enough blocks to fill the GPU once. Depends only on
// shapes, so a captured decode step replays at any position up to max_span.
// fused_rope: the decode kernel that also rotates and stores (AttentionArgs::fuse_rope).
int attention_splits(int rows, int n_heads, int n_kv_heads, int head_dim, int kv_type, int max_span,
                     int sm_count, bool generic_block = false, bool fused_rope = false);
// Writes (quantizing for q8/q4) k, v [n, n_kv_heads * head_dim] at positions *pos0.. of one
// layer's cache.
void kv_store(const KvStoreArgs& a, const half* k, const half* v, const int32_t* pos0,
              cudaStream_t s);
void attention(const AttentionArgs& a, cudaStream_t s);
// The decode blocks' tensor-core loop (FP16 cache, >= 4 query heads per KV head, head dims % 32 ==
// 0; decode_attn in attention_decode.cuh): on unless GYRE_CUDA_ATTN_MMA=0 (A/B measurements).
bool attention_mma_enabled();
// Whether attention() can do rope_kv_store's work for a.rope inside the decode kernel (a as
// filled for the launch, splits and counters included).
bool attention_fuses_rope(const AttentionArgs& a);
constexpr int kRopeStoreMaxHeadDim = 256;
// The contiguous cache: row r at position *pos0 + r (kv_store's rows).
void rope_kv_store(const RopeStoreArgs& a, const int32_t* pos0, cudaStream_t s);

// ---- attention_prefill.cu ---- (tensor cores; same arguments, splits ignored)
bool flash_prefill_supported(int head_dim);
void flash_prefill(const AttentionArgs& a, cudaStream_t s);

// ---- gemv.cu ----
// out[n, o] = x[n, i] . w[o, i] (+ bias[o]) for 1 <= n <= kGemvMaxRows.
constexpr int kGemvMaxRows = 8;
void gemv(half* out, const half* x, const half* w, const half* bias, int n, int out_dim, int in_dim,
          cudaStream_t s);
// The same with the output rows split over several tensors (fused projections).
void gemv_split(const OutSplit& out, const half* x, const half* w, const half* bias, int n,
                int out_dim, int in_dim, cudaStream_t s);
// out[n, hidden] = silu(x . gate) * (x . up) for a gate/up weight interleaved in blocks of
// kSwigluBlock rows (out_split.h), 2 * round_up(hidden, 8) rows. False (nothing launched) when
// the shapes or alignment need the generic path.
bool gemv_swiglu(half* out, const half* x, const half* w, int n, int hidden, int in_dim,
                 cudaStream_t s);

}  // namespace gyre::cuda
