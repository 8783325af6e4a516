// Attention over the paged KV cache (serving steps of ragged sequences; FP16 or q8/q4, the
// kernels instantiated per cache type like the contiguous ones):
//   - decode rows (and any row without a tile kernel): the split (flash-decoding) block of
//     attention_split.cuh, grid (split, kv head [x sub-group of <= 8 query heads], listed row),
//     then the shared combine kernel when the context is split;
//   - rows of prefill chunks: the tensor-core tile of attention_flash.cuh (head dims 64/80/96/
//     128), grid (tile of <= 64 consecutive rows of one sequence, query head).
// Both read keys through the sequence's page table: the PagedKv policy maps a position to its
// page and slot. The step's rows were stored at their slots beforehand (paged_kv_store), so
// later rows of a prefill chunk see the earlier ones.
#include <algorithm>

#include "backend/cuda/attention_decode.cuh"
#include "backend/cuda/attention_flash.cuh"
#include "backend/cuda/attention_split.cuh"
#include "backend/cuda/paged_attention.h"

namespace gyre::cuda {

namespace {

// Rows of one KV head of one sequence: row (page * n_kv_heads + kv_head) * page_size + slot.
struct PagedKv {
  static constexpr bool kContiguous = false;
  const void *k, *v;
  const half *kp, *vp;
  const int32_t* table;  // the sequence's pages
  int page_size, n_kv_heads, kv_head;
  __device__ int64_t row(int j) const {
    const int64_t page = table[j / page_size];
    return (page * n_kv_heads + kv_head) * page_size + j % page_size;
  }
};

__device__ PagedKv paged_kv(const PagedAttentionArgs& a, int seq, int kv_head) {
  return PagedKv{a.k_cache,
                 a.v_cache,
                 a.k_params,
                 a.v_params,
                 a.page_tables + static_cast<int64_t>(seq) * a.max_pages,
                 a.page_size,
                 a.n_kv_heads,
                 kv_head};
}

template <int T>
__global__ void paged_store_kernel(KvStoreArgs a, const int64_t* slots, int page_size,
                                   const half* k, const half* v) {
  pdl_begin();
  const KvPlanes planes{a.k_codes, a.v_codes, a.k_params, a.v_params};
  kv_store_rows<T>(planes, k, v, a.n, a.n_kv_heads, a.head_dim, [&](int r, int h) {
    const int64_t slot = slots[r];
    return (slot / page_size * a.n_kv_heads + h) * page_size + slot % page_size;
  });
}

// What one block of the split grid (x: split, y: KV head x head group, z: listed row) attends:
// its row's query heads, key range and partial-result slot (null with one split).
struct PagedSplitBlock {
  int D, kvh, row, gn, lo, end;
  int64_t first;  // the first query head's row in q / out, in units of head_dim
  float* part;
  unsigned* counter;  // its combine counter (attention_share.cuh); null: the combine kernel
};

__device__ __forceinline__ PagedSplitBlock paged_split_block(const PagedAttentionArgs& a,
                                                             int n_sub) {
  using split_attn::kMaxGroup;
  PagedSplitBlock b;
  b.D = a.head_dim;
  b.kvh = blockIdx.y / n_sub;
  const int sub = blockIdx.y % n_sub, listed = blockIdx.z;
  b.row = a.split_rows[listed];
  const int group = a.n_heads / a.n_kv_heads;
  const int g0 = sub * kMaxGroup;
  b.gn = min(kMaxGroup, group - g0);
  const int head0 = b.kvh * group + g0;
  const int pos = a.positions[b.row];
  b.lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
  b.end = pos + 1;
  b.first = static_cast<int64_t>(b.row) * a.n_heads + head0;
  b.part = a.splits > 1 ? a.partial + (static_cast<int64_t>(listed) * a.n_heads + head0) *
                                          a.splits * (b.D + 2)
                        : nullptr;
  b.counter =
      a.counters && a.splits > 1 ? a.counters + blockIdx.z * gridDim.y + blockIdx.y : nullptr;
  return b;
}

template <int T>
__global__ void __launch_bounds__(split_attn::kThreads)
    paged_split_kernel(PagedAttentionArgs a, int n_sub) {
  pdl_wait();  // the block lets the next kernel in (attention_share.cuh)
  const PagedSplitBlock b = paged_split_block(a, n_sub);
  split_attn::split_attend<T>(paged_kv(a, a.row_seq[b.row], b.kvh), a.q + b.first * b.D,
                              a.out + b.first * b.D, b.part, b.D, b.gn, b.lo, b.end, blockIdx.x,
                              a.splits, a.scale, {b.counter, a.single_span, a.trigger_span});
}

// Resident blocks per SM the paged decode kernel's registers must allow: what each instantiation
// had before the in-kernel combine (attention_share.cuh) and the late PDL trigger moved ptxas's
// choices (q8, 4 heads of <= 64 dims: 168 -> 177 registers, 3 -> 2 blocks; q8, one head: 96 ->
// 128, 5 -> 4). Not measured on the GPU beyond the tests (ptxas -v only).
template <int T, int L, int G>
constexpr int paged_min_blocks() {
  if constexpr (G >= 8) return 2;
  if constexpr (G >= 4) return 3;
  if constexpr (T == kKvQ8 || (T == kKvQ4 && L == 8)) return 5;
  if constexpr (T == kKvQ4) return 4;
  return 1;  // FP16, one head: 4 blocks by itself (a bound of 4 made ptxas spill)
}

// The same grid with the decode block (head dims % 8 == 0 up to 128).
// ROPE: the step's rope + store too (PagedAttentionArgs::fuse_rope; the row arrays were staged by
// the host before the step, so they are read before the PDL wait).
// MMA: the tensor-core loop (decode_attn::mma_loop).
template <int T, int L, int G, bool ROPE, bool MMA = false>
__global__ void __launch_bounds__(decode_attn::threads_of(MMA),
                                  (MMA ? 1 : paged_min_blocks<T, L, G>()))
    paged_decode_kernel(PagedAttentionArgs a, int n_sub, bool preload) {
  if constexpr (ROPE) {
    __shared__ decode_attn::RopeSmem sm;
    const PagedSplitBlock b = paged_split_block(a, n_sub);
    const split_share::Combine cmb{b.counter, a.single_span, a.trigger_span};
    const split_share::Share sh = split_share::share_of(b.lo, b.end, blockIdx.x, a.splits,
                                                        b.counter != nullptr, a.single_span);
    if (sh.idle) return;
    const int64_t slot = a.slots[b.row];
    const int64_t crow =
        (slot / a.page_size * a.n_kv_heads + b.kvh) * a.page_size + slot % a.page_size;
    const decode_attn::QRope rq = decode_attn::rope_tables(a.rope, b.end - 1, sm);
    // (pdl_wait inside; the block lets the next kernel in: attention_share.cuh). The row's older
    // keys were stored by earlier steps (a decode row's sequence gets no other rows in a step).
    const decode_attn::RopePrologue<T> pro{
        a.rope, b.row, b.kvh, crow, sh.hi == b.end, sm, preload ? b.end - 1 : INT_MIN};
    decode_attn::decode_attend<T, L, G, MMA>(
        paged_kv(a, a.row_seq[b.row], b.kvh), a.q + b.first * b.D, a.out + b.first * b.D, b.part,
        b.D, b.gn, b.lo, b.end, blockIdx.x, a.splits, a.scale, cmb, &rq, pro);
  } else {
    pdl_wait();  // the block lets the next kernel in (attention_share.cuh)
    const PagedSplitBlock b = paged_split_block(a, n_sub);
    decode_attn::decode_attend<T, L, G, MMA>(paged_kv(a, a.row_seq[b.row], b.kvh),
                                             a.q + b.first * b.D, a.out + b.first * b.D, b.part,
                                             b.D, b.gn, b.lo, b.end, blockIdx.x, a.splits, a.scale,
                                             {b.counter, a.single_span, a.trigger_span});
  }
}

template <int D, int T>
__global__ void __launch_bounds__(flash_attn::kThreads) paged_flash_kernel(PagedAttentionArgs a) {
  pdl_begin();
  const int* tile = a.tiles + 3 * blockIdx.x;
  const int row0 = tile[0], rows = tile[1], seq = tile[2];
  const int head = blockIdx.y, kvh = head / (a.n_heads / a.n_kv_heads);
  const int64_t row_stride = static_cast<int64_t>(a.n_heads) * D;
  const int64_t first = row0 * row_stride + head * D;
  flash_attn::flash_tile<D, T>(paged_kv(a, seq, kvh), a.q + first, a.out + first, row_stride, rows,
                               a.positions[row0], a.window, a.scale);
}

template <int D, int T>
void launch_paged_flash(const PagedAttentionArgs& a, cudaStream_t s) {
  const size_t bytes = flash_attn::Smem<D>::bytes;
  static bool configured = false;  // the attribute is per function; setting it once is enough
  if (!configured) {
    GYRE_CUDA_CHECK(cudaFuncSetAttribute(paged_flash_kernel<D, T>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(bytes)));
    configured = true;
  }
  const dim3 grid(static_cast<unsigned>(a.n_tiles), static_cast<unsigned>(a.n_heads));
  launch(paged_flash_kernel<D, T>, grid, flash_attn::kThreads, bytes, s, a);
  GYRE_CUDA_LAUNCHED();
}

}  // namespace

bool paged_tiles_supported(int head_dim) {
  return head_dim == 64 || head_dim == 80 || head_dim == 96 || head_dim == 128;
}

size_t paged_workspace_floats(int n_split_rows, int n_heads, int head_dim, int splits) {
  return splits <= 1 ? 0 : static_cast<size_t>(n_split_rows) * n_heads * splits * (head_dim + 2);
}

void paged_kv_store(const KvStoreArgs& a, const int64_t* slots, int page_size, const half* k,
                    const half* v, cudaStream_t s) {
  const int64_t blocks = (kv_store_threads(a.n, a.n_kv_heads, a.head_dim) + 255) / 256;
  if (blocks == 0) return;
  const unsigned grid = static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
  with_kv_kind(a.kv_type, [&](auto kind) {
    launch(paged_store_kernel<decltype(kind)::value>, grid, 256, 0, s, a, slots, page_size, k, v);
  });
  GYRE_CUDA_LAUNCHED();
}

bool paged_attention_fuses_rope(const PagedAttentionArgs& a) {
  const RopeStoreArgs& r = a.rope;
  return a.n_tiles == 0 && a.n_split_rows > 0 && r.store.n == a.n_split_rows && r.q == a.q &&
         a.slots != nullptr && !a.generic_block && (a.splits == 1 || a.counters != nullptr) &&
         r.store.k_codes == a.k_cache && r.store.v_codes == a.v_cache &&
         decode_attn::rope_fusable(r, a.head_dim, a.n_heads, a.n_kv_heads, a.kv_type);
}

void paged_attention(const PagedAttentionArgs& args, cudaStream_t s) {
  using namespace split_attn;
  PagedAttentionArgs a = args;
  a.mma_decode = a.mma_decode && attention_mma_enabled();
  GYRE_CHECK(a.head_dim > 0 && a.head_dim <= kMaxHeadDim,
             "CUDA paged attention supports head_dim up to ", kMaxHeadDim, ", got ", a.head_dim);
  GYRE_CHECK(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0, "bad head counts ", a.n_heads, "/",
             a.n_kv_heads);
  GYRE_CHECK(a.n_split_rows <= 65535, "CUDA paged attention: ", a.n_split_rows,
             " decode rows exceed one launch");
  with_kv_kind(a.kv_type, [&](auto kind) {
    constexpr int T = decltype(kind)::value;
    if (a.n_tiles > 0) {
      switch (a.head_dim) {
        case 64:
          launch_paged_flash<64, T>(a, s);
          break;
        case 80:
          launch_paged_flash<80, T>(a, s);
          break;
        case 96:
          launch_paged_flash<96, T>(a, s);
          break;
        case 128:
          launch_paged_flash<128, T>(a, s);
          break;
        default:
          fail("paged attention: no tile kernel for head_dim ", a.head_dim);
      }
    }
    if (a.n_split_rows == 0) return;
    const int group = a.n_heads / a.n_kv_heads;
    const int n_sub = (group + kMaxGroup - 1) / kMaxGroup;
    const dim3 grid(static_cast<unsigned>(a.splits), static_cast<unsigned>(a.n_kv_heads * n_sub),
                    static_cast<unsigned>(a.n_split_rows));
    if (a.fuse_rope)
      GYRE_CHECK(paged_attention_fuses_rope(a), "paged attention: fuse_rope where it cannot");
    if (a.fuse_rope || (decode_attn::usable(a.head_dim, a.q) && !a.generic_block)) {
      decode_attn::with_kernel(T, a.head_dim, std::min(group, kMaxGroup), a.mma_decode,
                               [&](auto kind, auto lanes, auto g, auto mma) {
                                 constexpr int K = decltype(kind)::value, L = lanes.value,
                                               G = g.value;
                                 constexpr bool M = decltype(mma)::value;
                                 launch(a.fuse_rope ? paged_decode_kernel<K, L, G, true, M>
                                                    : paged_decode_kernel<K, L, G, false, M>,
                                        grid, decode_attn::threads_of(M), 0, s, a, n_sub,
                                        decode_attn::preload_enabled());
                               });
    } else {
      launch(paged_split_kernel<T>, grid, kThreads, smem_bytes(a.head_dim, T), s, a, n_sub);
    }
    GYRE_CUDA_LAUNCHED();
  });
  if (a.n_split_rows == 0) return;
  if (a.splits > 1 && a.counters == nullptr)
    split_combine(a.out, a.partial, a.n_split_rows, a.n_heads, a.head_dim, a.splits, a.split_rows,
                  s);
}

}  // namespace gyre::cuda
