// Attention over the KV cache (FP16, q8 or q4: kv_quant.cuh), one kernel for prefill and decode
// (flash-decoding style):
//   grid (split, kv head [x sub-group of <= 8 query heads], query). A block takes its query
//   heads that share one KV head (GQA: each key and value is read once for the whole group),
//   walks its share of the causal (optionally sliding-window) range in chunks of 128 keys with an
//   online softmax (running max m, sum l, f32 accumulators in shared memory), and either writes
//   the normalised output (one split) or its partial (acc, m, l) for the combine kernel.
// Decode (one query) splits the context over many blocks so a 32k context still fills the GPU;
// the split count is fixed per launch while the chunk length follows the device-side position,
// which lets a captured CUDA graph replay at any position.
// The block's work is decode_attend (attention_decode.cuh) for head dims that are a multiple of
// 8 up to 128, else split_attend (attention_split.cuh); both are shared with the paged cache.
// Layout: cache rows [kv_head][max_seq] per layer (codes and, for q8/q4, params planes), so one
// head's keys are contiguous.
// Alternatives: a tensor-core (mma) tile kernel for prefill is the known faster path for
// head dims 64..128; this scalar kernel is the generic one (any head_dim <= 256).
#include <algorithm>
#include <cstdlib>
#include <string>

#include "backend/cuda/attention_decode.cuh"
#include "backend/cuda/attention_split.cuh"
#include "backend/cuda/rope_store.cuh"
#include "core/diag.h"

namespace gyre::cuda {

namespace {

constexpr int kDiagEmptyAttention = 2;  // decode_kernel's mode for GYRE_DIAG_SKIP=attnwork

using namespace split_attn;

// key/value rows of position t of kv head h: h * max_seq + *pos0 + t.
template <int T>
__global__ void kv_store_kernel(KvStoreArgs a, const half* k, const half* v, const int32_t* pos0) {
  pdl_begin();
  const int64_t base = *pos0;
  const KvPlanes planes{a.k_codes, a.v_codes, a.k_params, a.v_params};
  kv_store_rows<T>(planes, k, v, a.n, a.n_kv_heads, a.head_dim,
                   [&](int t, int h) { return static_cast<int64_t>(h) * a.max_seq + base + t; });
}

// This block's combine options: the counter of its (query, head group) (null: the combine
// kernel runs after), the single-block span and the PDL trigger span.
__device__ __forceinline__ split_share::Combine block_combine(const AttentionArgs& a) {
  return {a.counters && a.splits > 1 ? a.counters + blockIdx.z * gridDim.y + blockIdx.y : nullptr,
          a.single_span, a.trigger_span, a.min_chunk, a.weighted_from};
}

// rope_store.cuh's body at the rows kv_store writes (position *pos0 + row).
template <int T>
__global__ void __launch_bounds__(kRopeStoreThreads)
    rope_kv_store_kernel(RopeStoreArgs a, const int32_t* pos0) {
  pdl_begin();
  const int row = blockIdx.x;
  const int position = *pos0 + row;
  rope_store_row<T>(a, row, position,
                    [&](int h) { return static_cast<int64_t>(h) * a.store.max_seq + position; });
}

// Query qi's outputs from head head0 on; PERM: in AttentionArgs::out_index's order (a separate
// instantiation: the run-time branch cost every decode step 1-2%, bench/NOTES.md session 17).
template <bool PERM = false>
__device__ __forceinline__ split_share::OutRow out_row(const AttentionArgs& a, int qi, int head0) {
  half* full = a.out + static_cast<int64_t>(qi) * a.n_heads * a.head_dim;
  return split_share::OutRow(full + head0 * a.head_dim, PERM ? a.out_index : nullptr, full,
                             head0 * a.head_dim);
}

template <int T>
__global__ void __launch_bounds__(kThreads) attention_kernel(AttentionArgs a, int n_sub) {
  pdl_wait();  // the block lets the next kernel in (attention_share.cuh)
  const int D = a.head_dim;
  const int kvh = blockIdx.y / n_sub, sub = blockIdx.y % n_sub;
  const int qi = blockIdx.z;
  const int group = a.n_heads / a.n_kv_heads;
  const int g0 = sub * kMaxGroup;
  const int gn = min(kMaxGroup, group - g0);
  const int head0 = kvh * group + g0;
  const int pos = *a.pos0 + qi;
  const int lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
  const int64_t first = static_cast<int64_t>(qi) * a.n_heads + head0;
  split_attend<T>(contiguous_kv(a, kvh), a.q + first * D, out_row(a, qi, head0),
                  a.splits > 1 ? a.partial + first * a.splits * (D + 2) : nullptr, D, gn, lo,
                  pos + 1, blockIdx.x, a.splits, a.scale, block_combine(a));
}

// The same grid with the decode block (attention_decode.cuh): head dims % 8 == 0 up to 128.
// Thread 0 asks L2 for this block's share of the keys and values (two bulk prefetches) before the
// PDL wait: the rows were written by earlier steps (the newest one, which the kernel before this
// one writes, is fetched again after the wait: L2 is the point of coherence), so at short
// contexts their DRAM latency overlaps the RoPE/KV-store kernel instead of following it.
template <int T>
__device__ __forceinline__ void prefetch_share(const AttentionArgs& a, int kvh, int lo, int hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t row_bytes = static_cast<uint32_t>(kv_code_bytes_of<T>(a.head_dim));
  const split_share::Combine cmb = block_combine(a);
  const split_share::Share sh = split_share::share_of(
      lo, hi, blockIdx.x, a.splits, cmb.counter != nullptr, cmb.single_span, cmb.min_chunk);
  if (sh.idle || sh.hi <= sh.lo || row_bytes % 16 != 0) return;
  const int64_t first = static_cast<int64_t>(kvh) * a.max_seq + sh.lo;
  const uint32_t bytes = static_cast<uint32_t>(sh.hi - sh.lo) * row_bytes;
  for (const void* plane : {a.k_cache, a.v_cache}) {
    const char* src = static_cast<const char*>(plane) + first * row_bytes;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
  }
#else
  (void)a;
  (void)kvh;
  (void)lo;
  (void)hi;
#endif
}

// mode: 1 = keys loaded before the prologue (decode_attn::preload_enabled), 0 = not, or
// kDiagEmptyAttention. PERM (with ROPE only): the output in AttentionArgs::out_index's column
// order. MMA: the tensor-core loop (decode_attn::mma_loop; instantiated with L = 16 only).
template <int T, int L, int G, bool ROPE, bool PERM = false, bool MMA = false>
__global__ void __launch_bounds__(decode_attn::threads_of(MMA))
    decode_kernel(AttentionArgs a, int n_sub, int mode) {
  if (mode == kDiagEmptyAttention) {  // timing only: the launch and its waits, no work
    pdl_wait();
    return;
  }
  const bool preload = mode == 1;
  const int D = a.head_dim;
  const int kvh = blockIdx.y / n_sub, sub = blockIdx.y % n_sub;
  const int qi = blockIdx.z;
  const int group = a.n_heads / a.n_kv_heads;
  const int g0 = sub * kMaxGroup;
  const int gn = min(kMaxGroup, group - g0);
  const int head0 = kvh * group + g0;
  const int pos = *a.pos0 + qi;  // staged by the host before the step, not an earlier kernel
  const int lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
  if (a.prefetch_kv && threadIdx.x == 0) prefetch_share<T>(a, kvh, lo, pos + 1);
  if constexpr (!ROPE) pdl_wait();  // the block lets the next kernel in (attention_share.cuh)
  const int64_t first = static_cast<int64_t>(qi) * a.n_heads + head0;
  float* part = a.splits > 1 ? a.partial + first * a.splits * (D + 2) : nullptr;
  if constexpr (ROPE) {  // n_q == 1
    __shared__ decode_attn::RopeSmem sm;
    const split_share::Combine cmb = block_combine(a);
    const split_share::Share sh = split_share::share_of(
        lo, pos + 1, blockIdx.x, a.splits, cmb.counter != nullptr, cmb.single_span, cmb.min_chunk);
    if (sh.idle) return;
    const decode_attn::QRope rq = decode_attn::rope_tables(a.rope, pos, sm);
    // (pdl_wait inside; the block lets the next kernel in: attention_share.cuh)
    const decode_attn::RopePrologue<T> pro{a.rope,
                                           0,
                                           kvh,
                                           static_cast<int64_t>(kvh) * a.max_seq + pos,
                                           sh.hi == pos + 1,
                                           sm,
                                           preload ? pos : INT_MIN};
    decode_attn::decode_attend<T, L, G, MMA>(contiguous_kv(a, kvh), a.q + first * D,
                                             out_row<PERM>(a, qi, head0), part, D, gn, lo, pos + 1,
                                             blockIdx.x, a.splits, a.scale, cmb, &rq, pro);
  } else {
    decode_attn::decode_attend<T, L, G, MMA>(contiguous_kv(a, kvh), a.q + first * D,
                                             out_row(a, qi, head0), part, D, gn, lo, pos + 1,
                                             blockIdx.x, a.splits, a.scale, block_combine(a));
  }
}

// Blocks of the decode kernel resident per SM (registers bound it), per instantiation.
template <int T, int L, int G, bool ROPE, bool MMA>
int decode_blocks_per_sm() {
  static const int blocks = [] {
    int n = 0;
    GYRE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &n, decode_kernel<T, L, G, ROPE, false, MMA>, decode_attn::threads_of(MMA), 0));
    return std::max(1, n);
  }();
  return blocks;
}

}  // namespace

int attention_splits(int rows, int n_heads, int n_kv_heads, int head_dim, int kv_type, int max_span,
                     int sm_count, bool generic_block, bool fused_rope) {
  const int group = n_heads / n_kv_heads;
  const int blocks = std::max(1, rows * n_kv_heads * ((group + kMaxGroup - 1) / kMaxGroup));
  const int max_useful = std::max(1, (max_span + kMinChunk - 1) / kMinChunk);  // (the smallest)
  // split_attend: enough 13.5 KB blocks to fill the GPU a few times over.
  if (!decode_attn::supported(head_dim) || generic_block)
    return blocks >= 2 * sm_count
               ? 1
               : std::min({kMaxSplits, max_useful, (4 * sm_count + blocks - 1) / blocks});
  // Decode block: exactly one wave of resident blocks (every share has the same length, so a
  // second, partial wave would cost nearly a whole block time more).
  int per_sm = 1;
  decode_attn::with_kernel(kv_type, head_dim, std::min(group, kMaxGroup), attention_mma_enabled(),
                           [&](auto kind, auto lanes, auto g, auto mma) {
                             constexpr int T = decltype(kind)::value, L = lanes.value, G = g.value;
                             constexpr bool M = decltype(mma)::value;
                             per_sm = fused_rope ? decode_blocks_per_sm<T, L, G, true, M>()
                                                 : decode_blocks_per_sm<T, L, G, false, M>();
                           });
  // GYRE_CUDA_ATTN_FILL=P: P% of the resident blocks instead (measurements).
  static const int fill = [] {
    const char* e = std::getenv("GYRE_CUDA_ATTN_FILL");
    return e == nullptr ? 100 : std::clamp(std::atoi(e), 10, 800);
  }();
  const int resident = std::max(1, per_sm * sm_count * fill / 100);
  return blocks >= resident ? 1 : std::min({kMaxSplits, max_useful, resident / blocks});
}

size_t attention_workspace_floats(int n_q, int n_heads, int head_dim, int splits) {
  return splits <= 1 ? 0 : static_cast<size_t>(n_q) * n_heads * splits * (head_dim + 2);
}

void kv_store(const KvStoreArgs& a, const half* k, const half* v, const int32_t* pos0,
              cudaStream_t s) {
  const int64_t blocks = (kv_store_threads(a.n, a.n_kv_heads, a.head_dim) + 255) / 256;
  if (blocks == 0) return;
  const unsigned grid = static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
  with_kv_kind(a.kv_type, [&](auto kind) {
    launch(kv_store_kernel<decltype(kind)::value>, grid, 256, 0, s, a, k, v, pos0);
  });
  GYRE_CUDA_LAUNCHED();
}

// Diagnostics only (core/diag.h: GYRE_DIAG_SKIP=attn, rope or attnonly; onekey: attention over the
// newest key only): decode steps without their attention and/or RoPE/KV-store launches, to time
// what those kernels cost inside the PDL chain. Results are wrong then.
namespace {
bool diag_skip_rope() {
  static const bool skip = diag_skip("attn") || diag_skip("rope");
  return skip;
}
bool diag_one_key() {
  static const bool one = diag_skip("onekey");
  return one;
}
bool diag_skip_attention() {
  static const bool skip = diag_skip("attn") || diag_skip("attnonly");
  return skip;
}
// attnwork: the decode kernel is launched and waits as usual but does nothing (what the launch
// and its place in the PDL chain cost, against attn).
int decode_mode() {
  static const int mode =
      diag_skip("attnwork") ? kDiagEmptyAttention : (decode_attn::preload_enabled() ? 1 : 0);
  return mode;
}
}  // namespace

void rope_kv_store(const RopeStoreArgs& a, const int32_t* pos0, cudaStream_t s) {
  check_rope_store(a);
  if (diag_skip_rope() && a.store.n == 1) return;
  if (a.store.n <= 0) return;
  const dim3 grid(static_cast<unsigned>(a.store.n), rope_store_head_groups(a));
  with_kv_kind(a.store.kv_type, [&](auto kind) {
    launch(rope_kv_store_kernel<decltype(kind)::value>, grid, kRopeStoreThreads, 0, s, a, pos0);
  });
  GYRE_CUDA_LAUNCHED();
}

void attention(const AttentionArgs& args, cudaStream_t s) {
  AttentionArgs a = args;
  if (diag_one_key() && a.n_q == 1) a.window = 1;
  static const bool prefetch = [] {  // GYRE_CUDA_ATTN_PREFETCH=0: no L2 prefetch (decode_kernel)
    const char* e = std::getenv("GYRE_CUDA_ATTN_PREFETCH");
    return e == nullptr || std::string(e) != "0";
  }();
  a.prefetch_kv = prefetch && pdl_supported();
  a.mma_decode = a.mma_decode && attention_mma_enabled();
  GYRE_CHECK(a.out_index == nullptr || a.fuse_rope,
             "CUDA attention: only the decode kernel with RoPE writes another column order");
  GYRE_CHECK(a.head_dim > 0 && a.head_dim <= kMaxHeadDim, "CUDA attention supports head_dim up to ",
             kMaxHeadDim, ", got ", a.head_dim);
  GYRE_CHECK(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0, "bad head counts ", a.n_heads, "/",
             a.n_kv_heads);
  if (diag_skip_attention() && a.n_q == 1) return;
  const int group = a.n_heads / a.n_kv_heads;
  const int n_sub = (group + kMaxGroup - 1) / kMaxGroup;
  const dim3 grid(static_cast<unsigned>(a.splits), static_cast<unsigned>(a.n_kv_heads * n_sub),
                  static_cast<unsigned>(a.n_q));
  if (a.fuse_rope)
    GYRE_CHECK(attention_fuses_rope(a), "attention: fuse_rope set where it does not apply");
  if (a.fuse_rope || (decode_attn::usable(a.head_dim, a.q) && !a.generic_block)) {
    decode_attn::with_kernel(
        a.kv_type, a.head_dim, std::min(group, kMaxGroup), a.mma_decode,
        [&](auto kind, auto lanes, auto g, auto mma) {
          constexpr int T = decltype(kind)::value, L = lanes.value, G = g.value;
          constexpr bool M = decltype(mma)::value;
          launch(!a.fuse_rope             ? decode_kernel<T, L, G, false, false, M>
                 : a.out_index != nullptr ? decode_kernel<T, L, G, true, true, M>
                                          : decode_kernel<T, L, G, true, false, M>,
                 grid, decode_attn::threads_of(M), 0, s, a, n_sub, decode_mode());
        });
  } else {
    const size_t smem = smem_bytes(a.head_dim, a.kv_type);
    with_kv_kind(a.kv_type, [&](auto kind) {
      launch(attention_kernel<decltype(kind)::value>, grid, kThreads, smem, s, a, n_sub);
    });
  }
  GYRE_CUDA_LAUNCHED();
  if (a.splits > 1 && a.counters == nullptr)
    split_combine(a.out, a.partial, a.n_q, a.n_heads, a.head_dim, a.splits, nullptr, s);
}

bool attention_mma_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("GYRE_CUDA_ATTN_MMA");
    return e == nullptr || std::string(e) != "0";
  }();
  return on;
}

bool attention_fuses_rope(const AttentionArgs& a) {
  const RopeStoreArgs& r = a.rope;
  return a.n_q == 1 && r.q == a.q && !a.generic_block && (a.splits == 1 || a.counters != nullptr) &&
         r.store.n == 1 && r.store.max_seq == a.max_seq && r.store.k_codes == a.k_cache &&
         r.store.v_codes == a.v_cache &&
         decode_attn::rope_fusable(r, a.head_dim, a.n_heads, a.n_kv_heads, a.kv_type);
}

size_t attention_counters(int n_q, int n_heads, int n_kv_heads) {
  const int group = n_heads / std::max(1, n_kv_heads);
  return static_cast<size_t>(n_q) * n_kv_heads * ((group + kMaxGroup - 1) / kMaxGroup);
}

}  // namespace gyre::cuda
