// The CPU backend's paged KV cache and batched attention over ragged sequences (serving).
#pragma once
#include <memory>

#include "backend/backend.h"
#include "backend/cpu/thread_pool.h"
#include "core/kv_quant.h"

namespace gyre {

std::unique_ptr<PagedKvCache> cpu_new_paged_kv_cache(int n_layers, int n_kv_heads, int head_dim,
                                                     int num_pages, int page_size,
                                                     KvType type = KvType::F16);

// cache must come from cpu_new_paged_kv_cache.
void cpu_copy_kv_page(PagedKvCache& cache, int src, int dst, int num_tokens);

void cpu_attention_paged(ThreadPool& pool, Tensor& out, const Tensor& q, const Tensor& k,
                         const Tensor& v, PagedKvCache& cache, int layer, const PagedBatch& batch,
                         const AttentionParams& p);

}  // namespace gyre
