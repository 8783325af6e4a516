// Attention over the FP16 KV cache, one kernel for prefill and decode (flash-decoding style):
//   grid (split, kv head [x sub-group of <= 8 query heads], query). A block takes its query
//   heads that share one KV head (GQA: each key and value is read once for the whole group),
//   walks its share of the causal (optionally sliding-window) range in chunks of 128 keys with an
//   online softmax (running max m, sum l, f32 accumulators in shared memory), and either writes
//   the normalised output (one split) or its partial (acc, m, l) for the combine kernel.
// Decode (one query) splits the context over many blocks so a 32k context still fills the GPU;
// the split count is fixed per launch while the chunk length follows the device-side position,
// which lets a captured CUDA graph replay at any position.
// The block's work is split_attend (attention_split.cuh, shared with the paged cache).
// Layout: cache [kv_head][max_seq][head_dim] per layer, so one head's keys are contiguous.
// Alternatives: a tensor-core (mma) tile kernel for prefill is the known faster path for
// head dims 64..128; this scalar kernel is the generic one (any head_dim <= 256).
#include "backend/cuda/attention_split.cuh"

namespace gyre::cuda {

namespace {

using namespace split_attn;

// Rows of one KV head's keys (or values) in the contiguous cache [kv_head][max_seq][D].
struct ContiguousKv {
  static constexpr bool kContiguous = true;
  const half *k, *v;
  int64_t base;  // kv_head * max_seq * D
  int D;
  __device__ int64_t row(int j) const { return base + static_cast<int64_t>(j) * D; }
};

__global__ void kv_store_kernel(half* k_cache, half* v_cache, const half* k, const half* v,
                                const int32_t* pos0, int n, int n_kv, int dim, int max_seq) {
  pdl_begin();
  const int64_t total = static_cast<int64_t>(n) * n_kv * dim;
  const int base = *pos0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int d = static_cast<int>(i % dim);
    const int h = static_cast<int>((i / dim) % n_kv);
    const int t = static_cast<int>(i / (static_cast<int64_t>(dim) * n_kv));
    const int64_t dst = (static_cast<int64_t>(h) * max_seq + base + t) * dim + d;
    k_cache[dst] = k[i];
    v_cache[dst] = v[i];
  }
}

__global__ void __launch_bounds__(kThreads) attention_kernel(AttentionArgs a, int n_sub) {
  pdl_begin();
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
  const ContiguousKv kv{a.k_cache, a.v_cache, static_cast<int64_t>(kvh) * a.max_seq * D, D};
  split_attend(kv, a.q + first * D, a.out + first * D,
               a.splits > 1 ? a.partial + first * a.splits * (D + 2) : nullptr, D, gn, lo, pos + 1,
               blockIdx.x, a.splits, a.scale);
}

}  // namespace

size_t attention_workspace_floats(int n_q, int n_heads, int head_dim, int splits) {
  return splits <= 1 ? 0 : static_cast<size_t>(n_q) * n_heads * splits * (head_dim + 2);
}

void kv_store(half* k_cache, half* v_cache, const half* k, const half* v, const int32_t* pos0,
              int n, int n_kv_heads, int head_dim, int max_seq, cudaStream_t s) {
  const int64_t total = static_cast<int64_t>(n) * n_kv_heads * head_dim;
  const int64_t blocks = (total + 255) / 256;
  launch(kv_store_kernel, static_cast<unsigned>(blocks < 65536 ? blocks : 65536), 256, 0, s,
         k_cache, v_cache, k, v, pos0, n, n_kv_heads, head_dim, max_seq);
  GYRE_CUDA_LAUNCHED();
}

void attention(const AttentionArgs& a, cudaStream_t s) {
  GYRE_CHECK(a.head_dim > 0 && a.head_dim <= kMaxHeadDim, "CUDA attention supports head_dim up to ",
             kMaxHeadDim, ", got ", a.head_dim);
  GYRE_CHECK(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0, "bad head counts ", a.n_heads, "/",
             a.n_kv_heads);
  const int group = a.n_heads / a.n_kv_heads;
  const int n_sub = (group + kMaxGroup - 1) / kMaxGroup;
  const size_t smem = smem_bytes(a.head_dim);
  const dim3 grid(static_cast<unsigned>(a.splits), static_cast<unsigned>(a.n_kv_heads * n_sub),
                  static_cast<unsigned>(a.n_q));
  launch(attention_kernel, grid, kThreads, smem, s, a, n_sub);
  GYRE_CUDA_LAUNCHED();
  if (a.splits > 1)
    split_combine(a.out, a.partial, a.n_q, a.n_heads, a.head_dim, a.splits, nullptr, s);
}

}  // namespace gyre::cuda
