// Shared helpers of the CUDA backend's host code and kernels: error checks that turn CUDA
// failures into gyre::Error, and the launch parameter structs of every kernel family.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

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
  bool interleaved = false;
  float attn_factor = 1.0f;
};
void rope(half* x, const int32_t* positions, const float* inv_freq, const RopeArgs& a,
          cudaStream_t s);

// ---- attention.cu ----
struct AttentionArgs {
  const half* q = nullptr;        // [n_q, n_heads * head_dim]
  const half* k_cache = nullptr;  // this layer's keys: [n_kv_heads][max_seq][head_dim]
  const half* v_cache = nullptr;
  half* out = nullptr;            // [n_q, n_heads * head_dim]
  float* partial = nullptr;       // split workspace: attention_workspace_floats() floats
  const int32_t* pos0 = nullptr;  // device: position of query 0
  int n_q = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, max_seq = 0;
  int window = 0;  // 0: full causal attention
  int splits = 1;  // context chunks per query, combined afterwards when > 1
  float scale = 0.0f;
};
size_t attention_workspace_floats(int n_q, int n_heads, int head_dim, int splits);
// Writes k, v [n, n_kv_heads * head_dim] at positions *pos0.. of one layer's cache.
void kv_store(half* k_cache, half* v_cache, const half* k, const half* v, const int32_t* pos0,
              int n, int n_kv_heads, int head_dim, int max_seq, cudaStream_t s);
void attention(const AttentionArgs& a, cudaStream_t s);

// ---- attention_prefill.cu ---- (tensor cores; same arguments, splits ignored)
bool flash_prefill_supported(int head_dim);
void flash_prefill(const AttentionArgs& a, cudaStream_t s);

// ---- gemv.cu ----
// out[n, o] = x[n, i] . w[o, i] (+ bias[o]) for 1 <= n <= kGemvMaxRows.
constexpr int kGemvMaxRows = 8;
void gemv(half* out, const half* x, const half* w, const half* bias, int n, int out_dim, int in_dim,
          cudaStream_t s);

}  // namespace gyre::cuda
