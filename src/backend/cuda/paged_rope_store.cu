// Rotary embedding of a serving step's q and k fused with the paged KV-cache store (the body is
// rope_store.cuh's, shared with the contiguous cache). Measured before (ncu, H100, 32-row decode
// step of the Llama-3-8B shape): rope 4.3% and the store 2.4% of the step's GPU time, both a few
// microseconds of mostly launch and latency per layer. Measured after (H100, same shape, 4 runs
// each, bench/NOTES.md): the 32-row forward unchanged within noise (4.80 ms; PDL already hid most
// of the extra launch), serving 32 requests 5,777 -> 5,913 tok/s mean (noisy, +-150).
#include "backend/cuda/paged_attention.h"
#include "backend/cuda/rope_store.cuh"

namespace gyre::cuda {

namespace {

template <int T>
__global__ void __launch_bounds__(kRopeStoreThreads) paged_rope_store_kernel(PagedRopeStoreArgs a) {
  pdl_begin();
  const int row = blockIdx.x;
  const int64_t slot = a.slots[row];
  const int n_kv = a.rope.store.n_kv_heads;
  rope_store_row<T>(a.rope, row, a.positions[row], [&](int h) {
    return (slot / a.page_size * n_kv + h) * a.page_size + slot % a.page_size;
  });
}

}  // namespace

void paged_rope_store(const PagedRopeStoreArgs& a, cudaStream_t s) {
  check_rope_store(a.rope);
  if (a.rope.store.n <= 0) return;
  const dim3 grid(static_cast<unsigned>(a.rope.store.n), rope_store_head_groups(a.rope));
  with_kv_kind(a.rope.store.kv_type, [&](auto kind) {
    launch(paged_rope_store_kernel<decltype(kind)::value>, grid, kRopeStoreThreads, 0, s, a);
  });
  GYRE_CUDA_LAUNCHED();
}

}  // namespace gyre::cuda
