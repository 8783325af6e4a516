// RoPE, the KV cache (f32 rows, or q8/q4: core/kv_quant.h) and causal attention of the CPU backend
// (the ops that know about heads).
#pragma once
#include <memory>

#include "backend/backend.h"
#include "backend/cpu/thread_pool.h"
#include "core/kv_quant.h"

namespace gyre {

std::unique_ptr<KvCache> cpu_new_kv_cache(int n_layers, int n_kv_heads, int head_dim, int max_seq,
                                          KvType type = KvType::F16);

void cpu_rope(ThreadPool& pool, Tensor& x, int n_heads, int head_dim, const int32_t* positions,
              const RopeTable& table);

// cache must come from cpu_new_kv_cache.
void cpu_attention(ThreadPool& pool, Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                   KvCache& cache, int layer, int pos0, const AttentionParams& p);

}  // namespace gyre
