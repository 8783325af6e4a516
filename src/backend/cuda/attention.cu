// Attention over the FP16 KV cache, one kernel for prefill and decode (flash-decoding style):
//   grid (split, kv head [x sub-group of <= 8 query heads], query). A block takes its query
//   heads that share one KV head (GQA: each key and value is read once for the whole group),
//   walks its share of the causal (optionally sliding-window) range in chunks of 128 keys with an
//   online softmax (running max m, sum l, f32 accumulators in shared memory), and either writes
//   the normalised output (one split) or its partial (acc, m, l) for the combine kernel.
// Decode (one query) splits the context over many blocks so a 32k context still fills the GPU;
// the split count is fixed per launch while the chunk length follows the device-side position,
// which lets a captured CUDA graph replay at any position.
// Keys: one thread per key, its row's 16-byte loads all issued before the math, the scaled query
// broadcast from shared memory. Values: each thread owns (head, dim pair) outputs, coalesced across
// the row. Layout: cache [kv_head][max_seq][head_dim] per layer, so one head's keys are contiguous.
// Quantized caches (q8/q4, kv_quant.cuh): the same kernel, instantiated per cache type, reads
// codes and dequantizes them in registers (keys 8 dims at a time, values a dim pair at a time).
// Alternatives: a tensor-core (mma) tile kernel for prefill is the known faster path for
// head dims 64..128; this scalar kernel is the generic one (any head_dim <= 256).
#include <cfloat>

#include "backend/cuda/kv_quant.cuh"
#include "backend/cuda/launch.h"

namespace gyre::cuda {

namespace {

constexpr int kThreads = 128;  // also keys per chunk
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroup = 8;
// Smallest share of the context per split. Measured (ncu, H100, Llama-3-8B shape, 130 keys):
// with 128-key shares one block did all the work of a decode step at short context, 58 us per
// layer; smaller shares spread short contexts over several blocks.
constexpr int kMinChunk = 32;
constexpr int kMaxHeadDim = 256;

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

// One warp per (token, KV head, block of 32 dims) and per k/v: quantizes that block of the row.
template <int T>
__global__ void kv_store_quant_kernel(KvStoreArgs a, const half* k, const half* v,
                                      const int32_t* pos0) {
  pdl_begin();
  const int blocks = (a.head_dim + 31) / 32;
  const int64_t warps = static_cast<int64_t>(a.n) * a.n_kv_heads * blocks * 2;
  const int lane = threadIdx.x & 31;
  const int base = *pos0;
  for (int64_t w = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5; w < warps;
       w += (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5) {
    const int kv = static_cast<int>(w & 1);
    const int64_t rest = w >> 1;
    const int b = static_cast<int>(rest % blocks);
    const int h = static_cast<int>((rest / blocks) % a.n_kv_heads);
    const int t = static_cast<int>(rest / (static_cast<int64_t>(blocks) * a.n_kv_heads));
    const int d = b * 32 + lane;
    const bool active = d < a.head_dim;
    const half* src = (kv ? v : k) + (static_cast<int64_t>(t) * a.n_kv_heads + h) * a.head_dim;
    const float x = active ? __half2float(src[d]) : 0.0f;
    const int64_t row = static_cast<int64_t>(h) * a.max_seq + base + t;
    uint8_t* codes =
        static_cast<uint8_t*>(kv ? a.v_codes : a.k_codes) + row * kv_code_bytes_of<T>(a.head_dim);
    half* params = (kv ? a.v_params : a.k_params) + row * kv_param_halves_of<T>(a.head_dim);
    kv_quantize_block<T>(x, active, b * 32, codes, params);
  }
}

template <int T>
__global__ void __launch_bounds__(kThreads) attention_kernel(AttentionArgs a, int n_sub) {
  pdl_begin();
  extern __shared__ float smem[];
  const int D = a.head_dim;
  float* q_s = smem;                          // [kMaxGroup][D], pre-scaled
  float* acc_s = q_s + kMaxGroup * D;         // [kMaxGroup][D]
  float* p_s = acc_s + kMaxGroup * D;         // [kMaxGroup][kThreads]
  float* red_s = p_s + kMaxGroup * kThreads;  // [kWarps][kMaxGroup]
  float* m_s = red_s + kWarps * kMaxGroup;    // [kMaxGroup]
  float* l_s = m_s + kMaxGroup;
  float* alpha_s = l_s + kMaxGroup;
  // q8/q4: the chunk's value-row params, [kThreads][P] halves (after the floats, 4-aligned).
  half* vpar_s = reinterpret_cast<half*>(alpha_s + kMaxGroup);
  const int P = kv_param_halves_of<T>(a.head_dim);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int split = blockIdx.x;
  const int kvh = blockIdx.y / n_sub, sub = blockIdx.y % n_sub;
  const int qi = blockIdx.z;
  const int group = a.n_heads / a.n_kv_heads;
  const int g0 = sub * kMaxGroup;
  const int gn = min(kMaxGroup, group - g0);
  const int head0 = kvh * group + g0;

  const int pos = *a.pos0 + qi;
  const int lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
  const int hi = pos + 1;
  int chunk = (hi - lo + a.splits - 1) / a.splits;
  if (a.splits > 1) chunk = max(chunk, kMinChunk);
  const int my_lo = min(hi, lo + split * chunk);
  const int my_hi = min(hi, my_lo + chunk);

  const half* qrow = a.q + (static_cast<int64_t>(qi) * a.n_heads + head0) * D;
  for (int i = tid; i < gn * D; i += kThreads) {
    q_s[i] = __half2float(qrow[i]) * a.scale;
    acc_s[i] = 0.0f;
  }
  if (tid < kMaxGroup) {
    m_s[tid] = -FLT_MAX;
    l_s[tid] = 0.0f;
  }
  __syncthreads();

  const int64_t row0 = static_cast<int64_t>(kvh) * a.max_seq;
  for (int c0 = my_lo; c0 < my_hi; c0 += kThreads) {
    const int j = c0 + tid;
    const bool valid = j < my_hi;
    float s[kMaxGroup];
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) s[g] = 0.0f;
    if (valid && T != kKvF16) {
      // This thread's value row params to shared memory: the value loop then reads one code
      // load per key from global memory instead of two.
      const half* vp = a.v_params + (row0 + j) * P;
      for (int i = 0; i < P; ++i) vpar_s[tid * P + i] = vp[i];
      const KvRow krow = kv_row<T>(a.k_cache, a.k_params, row0 + j, D);
      if ((D & 7) == 0) {
        // As for FP16: the codes of up to 128 dims loaded first, then dequantized and used.
        for (int base = 0; base < D; base += 128) {
          typename KvRaw8<T>::type raw[16];
#pragma unroll
          for (int u = 0; u < 16; ++u)
            if (base + u * 8 < D) raw[u] = kv_raw8<T>(krow, base + u * 8);
#pragma unroll
          for (int u = 0; u < 16; ++u) {
            const int d0 = base + u * 8;
            if (d0 >= D) break;
            float kf[8];
            kv_decode8<T>(raw[u], krow, d0, kf);
#pragma unroll
            for (int e = 0; e < 8; ++e)
#pragma unroll
              for (int g = 0; g < kMaxGroup; ++g)
                if (g < gn) s[g] += q_s[g * D + d0 + e] * kf[e];
          }
        }
      } else {
        for (int d = 0; d < D; ++d) {
          const float kf = kv_load1<T>(krow, d);
#pragma unroll
          for (int g = 0; g < kMaxGroup; ++g)
            if (g < gn) s[g] += q_s[g * D + d] * kf;
        }
      }
    } else if (valid) {
      const half* kbase = static_cast<const half*>(a.k_cache) + row0 * D;
      const half* krow = kbase + static_cast<int64_t>(j) * D;
      if ((D & 7) == 0) {
        // All loads of up to 128 dims first, then the math: one memory round trip, not 16.
        for (int base = 0; base < D; base += 128) {
          uint4 raw[16];
#pragma unroll
          for (int u = 0; u < 16; ++u)
            if (base + u * 8 < D) raw[u] = *reinterpret_cast<const uint4*>(krow + base + u * 8);
#pragma unroll
          for (int u = 0; u < 16; ++u) {
            if (base + u * 8 >= D) break;
            const half2* h2 = reinterpret_cast<const half2*>(&raw[u]);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float2 kf = __half22float2(h2[e]);
              const int d = base + u * 8 + 2 * e;
#pragma unroll
              for (int g = 0; g < kMaxGroup; ++g)
                if (g < gn) s[g] += q_s[g * D + d] * kf.x + q_s[g * D + d + 1] * kf.y;
            }
          }
        }
      } else {
        for (int d = 0; d < D; ++d) {
          const float kf = __half2float(krow[d]);
#pragma unroll
          for (int g = 0; g < kMaxGroup; ++g)
            if (g < gn) s[g] += q_s[g * D + d] * kf;
        }
      }
    }
    // Chunk maximum per head -> new running maximum and the rescale factor of the old sums.
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      float v = valid ? s[g] : -FLT_MAX;
      for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
      if (lane == 0) red_s[warp * kMaxGroup + g] = v;
    }
    __syncthreads();
    if (tid < gn) {
      float cm = red_s[tid];
      for (int w = 1; w < kWarps; ++w) cm = fmaxf(cm, red_s[w * kMaxGroup + tid]);
      const float m_new = fmaxf(m_s[tid], cm);
      alpha_s[tid] = __expf(m_s[tid] - m_new);
      m_s[tid] = m_new;
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      const float p = (valid && g < gn) ? __expf(s[g] - m_s[g]) : 0.0f;
      p_s[g * kThreads + tid] = p;
      float v = p;
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) red_s[warp * kMaxGroup + g] = v;
    }
    __syncthreads();
    if (tid < gn) {
      float sum = 0.0f;
      for (int w = 0; w < kWarps; ++w) sum += red_s[w * kMaxGroup + tid];
      l_s[tid] = l_s[tid] * alpha_s[tid] + sum;
    }
    const int cnt = min(kThreads, my_hi - c0);
    if constexpr (T != kKvF16) {
      if ((D & 1) == 0) {
        const int pairs = D / 2;
        for (int i = tid; i < gn * pairs; i += kThreads) {
          const int g = i / pairs, d = 2 * (i % pairs);
          float ax = acc_s[g * D + d] * alpha_s[g], ay = acc_s[g * D + d + 1] * alpha_s[g];
          const float* pg = p_s + g * kThreads;
          const int64_t row_bytes = kv_code_bytes_of<T>(D);
          const uint8_t* vc = static_cast<const uint8_t*>(a.v_cache) + (row0 + c0) * row_bytes +
                              (T == kKvQ8 ? d : d / 2);
          const half* par = vpar_s + (T == kKvQ8 ? (d >> 5) : 2 * (d >> 5));
#pragma unroll 16
          for (int jj = 0; jj < cnt; ++jj) {
            float2 vf;
            if constexpr (T == kKvQ8) {
              const float sc = __half2float(par[jj * P]);
              const char2 c = *reinterpret_cast<const char2*>(vc + jj * row_bytes);
              vf = make_float2(sc * static_cast<float>(c.x), sc * static_cast<float>(c.y));
            } else {
              const float2 sm = __half22float2(*reinterpret_cast<const half2*>(par + jj * P));
              const unsigned b = vc[jj * row_bytes];
              vf = make_float2(sm.y + sm.x * static_cast<float>(b & 15u),
                               sm.y + sm.x * static_cast<float>(b >> 4));
            }
            ax += pg[jj] * vf.x;
            ay += pg[jj] * vf.y;
          }
          acc_s[g * D + d] = ax;
          acc_s[g * D + d + 1] = ay;
        }
      } else {
        for (int i = tid; i < gn * D; i += kThreads) {
          const int g = i / D, d = i % D;
          float acc = acc_s[i] * alpha_s[g];
          const float* pg = p_s + g * kThreads;
          for (int jj = 0; jj < cnt; ++jj)
            acc += pg[jj] * kv_load1<T>(kv_row<T>(a.v_cache, a.v_params, row0 + c0 + jj, D), d);
          acc_s[i] = acc;
        }
      }
      __syncthreads();
      continue;
    }
    const half* vchunk = static_cast<const half*>(a.v_cache) + (row0 + c0) * D;
    if ((D & 1) == 0) {
      const int pairs = D / 2;
      for (int i = tid; i < gn * pairs; i += kThreads) {
        const int g = i / pairs, d = 2 * (i % pairs);
        float ax = acc_s[g * D + d] * alpha_s[g], ay = acc_s[g * D + d + 1] * alpha_s[g];
        const float* pg = p_s + g * kThreads;
#pragma unroll 16
        for (int jj = 0; jj < cnt; ++jj) {
          const float2 vf = __half22float2(*reinterpret_cast<const half2*>(vchunk + jj * D + d));
          ax += pg[jj] * vf.x;
          ay += pg[jj] * vf.y;
        }
        acc_s[g * D + d] = ax;
        acc_s[g * D + d + 1] = ay;
      }
    } else {
      for (int i = tid; i < gn * D; i += kThreads) {
        const int g = i / D, d = i % D;
        float acc = acc_s[i] * alpha_s[g];
        const float* pg = p_s + g * kThreads;
        for (int jj = 0; jj < cnt; ++jj) acc += pg[jj] * __half2float(vchunk[jj * D + d]);
        acc_s[i] = acc;
      }
    }
    __syncthreads();
  }

  if (a.splits == 1) {
    half* orow = a.out + (static_cast<int64_t>(qi) * a.n_heads + head0) * D;
    for (int i = tid; i < gn * D; i += kThreads) {
      const float l = l_s[i / D];
      orow[i] = __float2half(l > 0.0f ? acc_s[i] / l : 0.0f);
    }
  } else {
    for (int i = tid; i < gn * (D + 2); i += kThreads) {
      const int g = i / (D + 2), d = i % (D + 2);
      float* part =
          a.partial +
          ((static_cast<int64_t>(qi) * a.n_heads + head0 + g) * a.splits + split) * (D + 2);
      part[d] = d < D ? acc_s[g * D + d] : (d == D ? m_s[g] : l_s[g]);
    }
  }
}

// out = sum_s acc_s * e^(m_s - M) / sum_s l_s * e^(m_s - M), M the largest m_s.
__global__ void combine_kernel(half* out, const float* partial, int splits, int dim) {
  pdl_begin();
  const int64_t qh = blockIdx.x;  // query * n_heads + head
  const float* part = partial + qh * splits * (dim + 2);
  float m_max = -FLT_MAX;
  for (int s = 0; s < splits; ++s) m_max = fmaxf(m_max, part[s * (dim + 2) + dim]);
  float l = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float* p = part + s * (dim + 2);
    l += p[dim + 1] * __expf(p[dim] - m_max);
  }
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float* p = part + s * (dim + 2);
      acc += p[d] * __expf(p[dim] - m_max);
    }
    out[qh * dim + d] = __float2half(l > 0.0f ? acc / l : 0.0f);
  }
}

}  // namespace

size_t attention_workspace_floats(int n_q, int n_heads, int head_dim, int splits) {
  return splits <= 1 ? 0 : static_cast<size_t>(n_q) * n_heads * splits * (head_dim + 2);
}

void kv_store(const KvStoreArgs& a, const half* k, const half* v, const int32_t* pos0,
              cudaStream_t s) {
  if (a.kv_type == kKvF16) {
    const int64_t total = static_cast<int64_t>(a.n) * a.n_kv_heads * a.head_dim;
    const int64_t blocks = (total + 255) / 256;
    launch(kv_store_kernel, static_cast<unsigned>(blocks < 65536 ? blocks : 65536), 256, 0, s,
           static_cast<half*>(a.k_codes), static_cast<half*>(a.v_codes), k, v, pos0, a.n,
           a.n_kv_heads, a.head_dim, a.max_seq);
    GYRE_CUDA_LAUNCHED();
    return;
  }
  const int64_t warps = static_cast<int64_t>(a.n) * a.n_kv_heads * ((a.head_dim + 31) / 32) * 2;
  const int64_t blocks = (warps + 7) / 8;
  const unsigned grid = static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
  if (a.kv_type == kKvQ8)
    launch(kv_store_quant_kernel<kKvQ8>, grid, 256, 0, s, a, k, v, pos0);
  else
    launch(kv_store_quant_kernel<kKvQ4>, grid, 256, 0, s, a, k, v, pos0);
  GYRE_CUDA_LAUNCHED();
}

void attention(const AttentionArgs& a, cudaStream_t s) {
  GYRE_CHECK(a.head_dim > 0 && a.head_dim <= kMaxHeadDim, "CUDA attention supports head_dim up to ",
             kMaxHeadDim, ", got ", a.head_dim);
  GYRE_CHECK(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0, "bad head counts ", a.n_heads, "/",
             a.n_kv_heads);
  const int group = a.n_heads / a.n_kv_heads;
  const int n_sub = (group + kMaxGroup - 1) / kMaxGroup;
  const size_t smem = sizeof(float) * (2 * kMaxGroup * a.head_dim + kMaxGroup * kThreads +
                                       kWarps * kMaxGroup + 3 * kMaxGroup) +
                      sizeof(half) * kThreads * 2 * ((a.head_dim + 31) / 32);
  const dim3 grid(static_cast<unsigned>(a.splits), static_cast<unsigned>(a.n_kv_heads * n_sub),
                  static_cast<unsigned>(a.n_q));
  switch (a.kv_type) {
    case kKvF16:
      launch(attention_kernel<kKvF16>, grid, kThreads, smem, s, a, n_sub);
      break;
    case kKvQ8:
      launch(attention_kernel<kKvQ8>, grid, kThreads, smem, s, a, n_sub);
      break;
    case kKvQ4:
      launch(attention_kernel<kKvQ4>, grid, kThreads, smem, s, a, n_sub);
      break;
    default:
      fail("CUDA attention: unknown KV cache type ", a.kv_type);
  }
  GYRE_CUDA_LAUNCHED();
  if (a.splits > 1) {
    const int threads = a.head_dim < 128 ? 32 * ((a.head_dim + 31) / 32) : 128;
    launch(combine_kernel, static_cast<unsigned>(a.n_q * a.n_heads), threads, 0, s, a.out,
           a.partial, a.splits, a.head_dim);
    GYRE_CUDA_LAUNCHED();
  }
}

}  // namespace gyre::cuda
