// Kernels of the CUDA backend's paged KV cache (serving): the store of a step's keys and values
// at their slots, and attention over ragged sequences read through their page tables.
// Layout of one layer's keys (values likewise): rows [page][kv_head][slot] in a codes plane
// (FP16: the halves) and, for q8/q4, a params plane (row format core/kv_quant.h), so one head's
// keys in a page are contiguous and a page of one layer is one block of each plane.
#pragma once
#include "backend/cuda/cuda_common.h"

namespace gyre::cuda {

struct PagedAttentionArgs {
  const half* q = nullptr;  // [rows, n_heads * head_dim]
  half* out = nullptr;
  const void* k_cache = nullptr;  // this layer's key codes
  const void* v_cache = nullptr;
  const half* k_params = nullptr;  // q8/q4: this layer's key params
  const half* v_params = nullptr;
  int kv_type = 0;                       // KvKind (kv_quant.cuh)
  const int32_t* positions = nullptr;    // [rows] (device)
  const int32_t* row_seq = nullptr;      // [rows] sequence of each row
  const int32_t* page_tables = nullptr;  // [seqs][max_pages]
  int max_pages = 0, page_size = 0;
  int n_heads = 0, n_kv_heads = 0, head_dim = 0, window = 0;
  float scale = 0.0f;
  // Rows attended by the split kernel (decode rows, and every row without a tile kernel).
  const int32_t* split_rows = nullptr;
  int n_split_rows = 0, splits = 1;
  float* partial = nullptr;  // paged_workspace_floats()
  // Combine counters, zero between launches (attention_share.cuh), attention_counters(
  // n_split_rows, ...) of them; null: split_combine_kernel combines the partials. single_span:
  // contexts of at most this many keys are attended by one block (with counters).
  unsigned* counters = nullptr;
  int single_span = 0;
  int trigger_span = 1 << 30;  // PDL: longer contexts let the next kernel in after their keys
  bool mma_decode = true;      // the decode block's tensor-core loop where it applies (decode_attn)
  // Prefill tiles for the tensor-core kernel: [n_tiles][3] = first row, rows (<= 64), sequence;
  // a tile's rows have consecutive positions starting at positions[first row].
  const int32_t* tiles = nullptr;
  int n_tiles = 0;
  bool generic_block = false;  // split_attend for every head dim (benches comparing the blocks)
  // A decode-only step (one row per sequence, no tiles): the decode kernel rotates q as it loads
  // it and stores each row's rotated key and value at slots[row] (rope_kv_store's work, see
  // attention_decode.cuh; q stays unrotated in memory). Only where paged_attention_fuses_rope().
  bool fuse_rope = false;
  RopeStoreArgs rope;
  const int64_t* slots = nullptr;  // [rows] (device)
};

constexpr int kPagedTileRows = 64;
bool paged_tiles_supported(int head_dim);  // head dims of the tensor-core tile kernel
size_t paged_workspace_floats(int n_split_rows, int n_heads, int head_dim, int splits);

// k, v [a.n, n_kv_heads * head_dim] to slot slots[r] (= page * page_size + offset), quantized
// for q8/q4; a.max_seq is not used.
void paged_kv_store(const KvStoreArgs& a, const int64_t* slots, int page_size, const half* k,
                    const half* v, cudaStream_t s);
void paged_attention(const PagedAttentionArgs& a, cudaStream_t s);
// Whether paged_attention can do the rope + store of a.rope itself (a filled for the launch; the
// caller checks that every row is its sequence's only row of the step).
bool paged_attention_fuses_rope(const PagedAttentionArgs& a);

// rope of q and k fused with the store at slots[r] (paged_rope_store.cu; RopeStoreArgs in
// cuda_common.h; rope.store.max_seq is not used).
struct PagedRopeStoreArgs {
  RopeStoreArgs rope;
  const int32_t* positions = nullptr;  // [rows] (device)
  const int64_t* slots = nullptr;      // [rows] (device)
  int page_size = 0;
};
void paged_rope_store(const PagedRopeStoreArgs& a, cudaStream_t s);

}  // namespace gyre::cuda
