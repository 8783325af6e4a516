// The split (flash-decoding) attention block shared by the contiguous cache (attention.cu) and
// the paged cache (paged_attention.cu). One block: the query heads of one row that share one KV
// head (GQA: each key and value is read once for the group), over its share [lo, hi) of the
// keys, in chunks of kThreads keys with an online softmax (running max m, sum l, f32
// accumulators in shared memory). It writes the normalised output (one split) or its partial
// (acc, m, l) per head for split_combine_kernel.
// Keys: one thread per key, its row's loads all issued before the math, the scaled query
// broadcast from shared memory. Values: each thread owns (head, dim pair) outputs, coalesced
// across the row. The cache type T (kv_quant.cuh) is a template parameter: q8/q4 rows are read
// as codes and dequantized in registers (keys 8 dims at a time, values a dim pair at a time);
// the FP16 instantiation is the plain kernel. Where the rows live is the Kv policy's business:
//   Kv::kContiguous          rows of consecutive keys are consecutive (row(j + 1) = row(j) + 1)
//   int64_t Kv::row(int j)   row index of key j in the planes kv.k/kv.kp (its value: kv.v/kv.vp)
// A paged Kv stores each chunk's row indices in shared memory for the value pass.
#pragma once
#include <cfloat>

#include "backend/cuda/attention_share.cuh"
#include "backend/cuda/kv_quant.cuh"
#include "backend/cuda/launch.h"

namespace gyre::cuda::split_attn {

constexpr int kThreads = 128;  // also keys per chunk
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroup = 8;
using split_share::kMaxSplits;
using split_share::kMinChunk;
constexpr int kMaxHeadDim = 256;

// Shared memory of split_attend; q8/q4 add the chunk's value-row params (kThreads rows).
inline size_t smem_bytes(int head_dim, int kv_kind) {
  const size_t params = kv_kind == kKvQ8   ? kv_param_halves_of<kKvQ8>(head_dim)
                        : kv_kind == kKvQ4 ? kv_param_halves_of<kKvQ4>(head_dim)
                                           : 0;
  return sizeof(long long) * kThreads +
         sizeof(float) * (2 * kMaxGroup * head_dim + kMaxGroup * kThreads + kWarps * kMaxGroup +
                          3 * kMaxGroup) +
         sizeof(half) * kThreads * params;
}

// Attends rows' query heads [head0, head0 + gn) (already at qrow / orow) over keys [lo, hi)
// cut into `splits` shares; this block takes share `split` (attention_share.cuh: cmb). Call
// pdl_wait before: this lets the next kernel in. part: the partials of head0, (D + 2) floats per
// (head, split), heads `splits` shares apart.
template <int T, class Kv>
__device__ __forceinline__ void split_attend(const Kv& kv, const half* qrow,
                                             split_share::OutRow orow, float* part, int D, int gn,
                                             int lo, int hi, int split, int splits, float scale,
                                             const split_share::Combine& cmb) {
  extern __shared__ float smem[];
  long long* voff_s = reinterpret_cast<long long*>(smem);  // [kThreads] value row bytes (paged)
  float* q_s = smem + 2 * kThreads;                        // [kMaxGroup][D], pre-scaled
  float* acc_s = q_s + kMaxGroup * D;                      // [kMaxGroup][D]
  float* p_s = acc_s + kMaxGroup * D;                      // [kMaxGroup][kThreads]
  float* red_s = p_s + kMaxGroup * kThreads;               // [kWarps][kMaxGroup]
  float* m_s = red_s + kWarps * kMaxGroup;                 // [kMaxGroup]
  float* l_s = m_s + kMaxGroup;
  float* alpha_s = l_s + kMaxGroup;
  // q8/q4: the chunk's value-row params, [kThreads][P] halves: the value loop then makes one
  // global load per key (its codes), not two.
  half* vpar_s = reinterpret_cast<half*>(alpha_s + kMaxGroup);
  const int P = kv_param_halves_of<T>(D);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const bool triggered = split_share::early_trigger(hi - lo, cmb);
  const split_share::Share share =
      split_share::share_of(lo, hi, split, splits, cmb.counter != nullptr, cmb.single_span);
  if (share.idle) return;
  const int my_lo = share.lo, my_hi = share.hi;

  for (int i = tid; i < gn * D; i += kThreads) {
    q_s[i] = __half2float(qrow[i]) * scale;
    acc_s[i] = 0.0f;
  }
  if (tid < kMaxGroup) {
    m_s[tid] = -FLT_MAX;
    l_s[tid] = 0.0f;
  }
  __syncthreads();

  for (int c0 = my_lo; c0 < my_hi; c0 += kThreads) {
    const int j = c0 + tid;
    const bool valid = j < my_hi;
    float s[kMaxGroup];
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) s[g] = 0.0f;
    if (valid) {
      const int64_t row = kv.row(j);
      if constexpr (!Kv::kContiguous) voff_s[tid] = row * kv_code_bytes_of<T>(D);
      if constexpr (T != kKvF16) {
        const half* vp = kv.vp + row * P;
        for (int i = 0; i < P; ++i) vpar_s[tid * P + i] = vp[i];
      }
      const KvRow krow = kv_row<T>(kv.k, kv.kp, row, D);
      if ((D & 7) == 0) {
        // All loads of up to 128 dims first, then the math: one memory round trip, not 16.
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
            for (int e = 0; e < 8; e += 2) {
              const int d = d0 + e;
#pragma unroll
              for (int g = 0; g < kMaxGroup; ++g)
                if (g < gn) s[g] += q_s[g * D + d] * kf[e] + q_s[g * D + d + 1] * kf[e + 1];
            }
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
    // Codes of the chunk's value row jj: consecutive rows for a contiguous cache, else at the
    // offset stored in the key pass. Its params (q8/q4) are at vpar_s + jj * P.
    const int64_t row_bytes = kv_code_bytes_of<T>(D);
    const uint8_t* vcodes = static_cast<const uint8_t*>(kv.v);
    const int64_t vrow0 = Kv::kContiguous ? kv.row(c0) : 0;
    auto vrow = [&](int jj) -> const uint8_t* {
      if constexpr (Kv::kContiguous)
        return vcodes + (vrow0 + jj) * row_bytes;
      else
        return vcodes + voff_s[jj];
    };
    if ((D & 1) == 0) {
      const int pairs = D / 2;
      for (int i = tid; i < gn * pairs; i += kThreads) {
        const int g = i / pairs, d = 2 * (i % pairs);
        float ax = acc_s[g * D + d] * alpha_s[g], ay = acc_s[g * D + d + 1] * alpha_s[g];
        const float* pg = p_s + g * kThreads;
        // Byte of dims (d, d + 1) within a row, and their block's params within a row's params.
        const int code_at = T == kKvF16 ? 2 * d : T == kKvQ8 ? d : d / 2;
        const half* par = vpar_s + (T == kKvQ8 ? (d >> 5) : 2 * (d >> 5));
#pragma unroll 16
        for (int jj = 0; jj < cnt; ++jj) {
          const uint8_t* code = vrow(jj) + code_at;
          float2 vf;
          if constexpr (T == kKvF16) {
            vf = __half22float2(*reinterpret_cast<const half2*>(code));
          } else if constexpr (T == kKvQ8) {
            const float sc = __half2float(par[jj * P]);
            const char2 c = *reinterpret_cast<const char2*>(code);
            vf = make_float2(sc * static_cast<float>(c.x), sc * static_cast<float>(c.y));
          } else {
            const float2 sm = __half22float2(*reinterpret_cast<const half2*>(par + jj * P));
            const unsigned b = *code;
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
          acc += pg[jj] * kv_load1<T>(KvRow{vrow(jj), vpar_s + jj * P}, d);
        acc_s[i] = acc;
      }
    }
    __syncthreads();
  }

  if (!triggered) pdl_launch_dependents();
  if (share.shares == 1) {
    for (int i = tid; i < gn * D; i += kThreads) {
      const float l = l_s[i / D];
      orow.put(i, l > 0.0f ? acc_s[i] / l : 0.0f);
    }
  } else {
    for (int i = tid; i < gn * (D + 2); i += kThreads) {
      const int g = i / (D + 2), d = i % (D + 2);
      float* p = part + (static_cast<int64_t>(g) * splits + split) * (D + 2);
      p[d] = d < D ? acc_s[g * D + d] : (d == D ? m_s[g] : l_s[g]);
    }
    if (cmb.counter != nullptr)
      split_share::combine_if_last(part, orow, cmb.counter, D, gn, splits, share.shares,
                                   cmb.weighted_from);
  }
}

// One block per (query index, head): out = sum_s acc_s * e^(m_s - M) / sum_s l_s * e^(m_s - M),
// M the largest m_s. Query index qi writes row rows[qi] of out (qi itself when rows is null).
// The first warp computes the weights e^(m_s - M) once (splits <= kMaxSplits); then `groups`
// groups of threads each sum every groups-th split of their dims (independent loads, so a
// combine over ~50 splits is a round trip or two, not one per split), summed in shared memory.
// Internal linkage: each .cu file that includes this gets its own copy.
constexpr int kCombineGroups = 4;
static __global__ void split_combine_kernel(half* out, const float* partial, int splits, int dim,
                                            int n_heads, const int32_t* rows, int groups) {
  pdl_begin();
  __shared__ float weight_s[kMaxSplits];
  __shared__ float sum_s[kCombineGroups][kMaxHeadDim];
  __shared__ float inv_l_s;
  const int64_t qh = blockIdx.x;  // query index * n_heads + head
  const int64_t qi = qh / n_heads, head = qh % n_heads;
  const int64_t row = rows ? rows[qi] : qi;
  const float* part = partial + qh * splits * (dim + 2);
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float m_max = -FLT_MAX;
    for (int s = lane; s < splits; s += 32) m_max = fmaxf(m_max, part[s * (dim + 2) + dim]);
    for (int o = 16; o > 0; o >>= 1) m_max = fmaxf(m_max, __shfl_xor_sync(0xffffffffu, m_max, o));
    float l = 0.0f;
    for (int s = lane; s < splits; s += 32) {
      const float w = __expf(part[s * (dim + 2) + dim] - m_max);
      weight_s[s] = w;
      l += part[s * (dim + 2) + dim + 1] * w;
    }
    for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
    if (lane == 0) inv_l_s = l > 0.0f ? 1.0f / l : 0.0f;
  }
  __syncthreads();
  const int group_threads = blockDim.x / groups;
  const int group = threadIdx.x / group_threads, t = threadIdx.x % group_threads;
  for (int d = t; d < dim; d += group_threads) {
    float acc = 0.0f;
#pragma unroll 16
    for (int s = group; s < splits; s += groups) acc += part[s * (dim + 2) + d] * weight_s[s];
    sum_s[group][d] = acc;
  }
  __syncthreads();
  half* dst = out + (row * n_heads + head) * dim;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int g = 0; g < groups; ++g) acc += sum_s[g][d];
    dst[d] = __float2half(acc * inv_l_s);
  }
}

inline void split_combine(half* out, const float* partial, int n_q, int n_heads, int dim,
                          int splits, const int32_t* rows, cudaStream_t s) {
  const int dim_threads = dim < 128 ? 32 * ((dim + 31) / 32) : 128;
  const int groups = splits >= 8 ? kCombineGroups : 1;
  launch(split_combine_kernel, static_cast<unsigned>(n_q * n_heads), dim_threads * groups, 0, s,
         out, partial, splits, dim, n_heads, rows, groups);
  GYRE_CUDA_LAUNCHED();
}

}  // namespace gyre::cuda::split_attn
