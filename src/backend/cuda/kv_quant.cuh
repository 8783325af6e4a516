// Device side of the quantized KV cache (format: core/kv_quant.h): row addressing, dequantize on
// load for the attention blocks, the warp-wide quantizer and the store body of the contiguous and
// paged caches. Kernels take the cache type as a template parameter (KvKind), so the FP16 path
// compiles to plain FP16 loads. Both caches address rows the same way (kv_row with a row index);
// only the position->row numbering differs (ContiguousKv here, PagedKv in paged_attention.cu).
// A plane is one layer's keys (or values): codes [rows][kv_code_bytes] (FP16: the halves) and,
// for q8/q4, FP16 params [rows][kv_param_halves]. Rows are (kv head, position) pairs.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_common.h"
#include "core/error.h"

namespace gyre::cuda {

enum KvKind : int { kKvF16 = 0, kKvQ8 = 1, kKvQ4 = 2 };  // the order of gyre::KvType

template <int T>
__host__ __device__ __forceinline__ int64_t kv_code_bytes_of(int D) {
  return T == kKvQ8 ? D : T == kKvQ4 ? (D + 1) / 2 : 2 * static_cast<int64_t>(D);
}
template <int T>
__host__ __device__ __forceinline__ int kv_param_halves_of(int D) {
  const int blocks = (D + 31) / 32;
  return T == kKvQ8 ? blocks : T == kKvQ4 ? 2 * blocks : 0;
}

// Calls f(std::integral_constant<int, T>{}) for the runtime cache type `kind`: the host side of
// launching a kernel instantiated per type.
template <class F>
void with_kv_kind(int kind, F&& f) {
  switch (kind) {
    case kKvF16:
      f(std::integral_constant<int, kKvF16>{});
      break;
    case kKvQ8:
      f(std::integral_constant<int, kKvQ8>{});
      break;
    case kKvQ4:
      f(std::integral_constant<int, kKvQ4>{});
      break;
    default:
      fail("CUDA KV cache: unknown cache type ", kind);
  }
}

// One row of a plane.
struct KvRow {
  const uint8_t* codes;
  const half* params;
};
template <int T>
__device__ __forceinline__ KvRow kv_row(const void* codes, const half* params, int64_t row, int D) {
  return {static_cast<const uint8_t*>(codes) + row * kv_code_bytes_of<T>(D),
          T == kKvF16 ? nullptr : params + row * kv_param_halves_of<T>(D)};
}

// Dims d and d + 1 of a row (d even).
template <int T>
__device__ __forceinline__ float2 kv_load2(const KvRow& r, int d) {
  if constexpr (T == kKvF16) {
    return __half22float2(*reinterpret_cast<const half2*>(r.codes + 2 * d));
  } else if constexpr (T == kKvQ8) {
    const float s = __half2float(r.params[d >> 5]);
    const char2 c = *reinterpret_cast<const char2*>(r.codes + d);
    return make_float2(s * static_cast<float>(c.x), s * static_cast<float>(c.y));
  } else {
    const half2 sm = *reinterpret_cast<const half2*>(r.params + 2 * (d >> 5));
    const float s = __low2float(sm), mn = __high2float(sm);
    const unsigned b = r.codes[d >> 1];
    return make_float2(mn + s * static_cast<float>(b & 15u), mn + s * static_cast<float>(b >> 4));
  }
}

// Dim d of a row.
template <int T>
__device__ __forceinline__ float kv_load1(const KvRow& r, int d) {
  if constexpr (T == kKvF16) {
    return __half2float(reinterpret_cast<const half*>(r.codes)[d]);
  } else if constexpr (T == kKvQ8) {
    return __half2float(r.params[d >> 5]) *
           static_cast<float>(reinterpret_cast<const int8_t*>(r.codes)[d]);
  } else {
    const unsigned b = r.codes[d >> 1];
    const unsigned c = (d & 1) ? (b >> 4) : (b & 15u);
    return __half2float(r.params[2 * (d >> 5) + 1]) +
           __half2float(r.params[2 * (d >> 5)]) * static_cast<float>(c);
  }
}

// Dims d..d+7 of a row (d % 8 == 0 and head_dim % 8 == 0, which keeps the loads aligned: one
// 16-byte load for FP16, 8 bytes for q8, 4 bytes for q4). Split in a raw load and a decode so a
// kernel can issue all of a row's loads before the math (one memory round trip per row).
template <int T>
struct KvRaw8 {
  using type = uint4;
};
template <>
struct KvRaw8<kKvQ8> {
  using type = uint2;
};
template <>
struct KvRaw8<kKvQ4> {
  using type = uint32_t;
};

template <int T>
__device__ __forceinline__ typename KvRaw8<T>::type kv_raw8(const KvRow& r, int d) {
  if constexpr (T == kKvF16)
    return *reinterpret_cast<const uint4*>(r.codes + 2 * d);
  else if constexpr (T == kKvQ8)
    return *reinterpret_cast<const uint2*>(r.codes + d);
  else
    return *reinterpret_cast<const uint32_t*>(r.codes + (d >> 1));
}

template <int T>
__device__ __forceinline__ void kv_decode8(const typename KvRaw8<T>::type& raw, const KvRow& r,
                                           int d, float (&out)[8]) {
  if constexpr (T == kKvF16) {
    const half2* h2 = reinterpret_cast<const half2*>(&raw);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __half22float2(h2[e]);
      out[2 * e] = f.x;
      out[2 * e + 1] = f.y;
    }
  } else if constexpr (T == kKvQ8) {
    const float s = __half2float(r.params[d >> 5]);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const uint32_t word = e < 4 ? raw.x : raw.y;
      out[e] = s * static_cast<float>(static_cast<int8_t>((word >> (8 * (e & 3))) & 0xFFu));
    }
  } else {
    const half2 sm = *reinterpret_cast<const half2*>(r.params + 2 * (d >> 5));
    const float s = __low2float(sm), mn = __high2float(sm);
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] = mn + s * static_cast<float>((raw >> (4 * e)) & 15u);
  }
}

template <int T>
__device__ __forceinline__ void kv_load8(const KvRow& r, int d, float (&out)[8]) {
  kv_decode8<T>(kv_raw8<T>(r, d), r, d, out);
}

// Dims d..d+7 of a row as 8 halves (one 16-byte shared-memory store; FP16 rows are copied).
template <int T>
__device__ __forceinline__ uint4 kv_load8_half(const KvRow& r, int d) {
  if constexpr (T == kKvF16) {
    return kv_raw8<T>(r, d);
  } else {
    float f[8];
    kv_load8<T>(r, d, f);
    uint4 out;
    half2* h2 = reinterpret_cast<half2*>(&out);
#pragma unroll
    for (int e = 0; e < 4; ++e) h2[e] = __floats2half2_rn(f[2 * e], f[2 * e + 1]);
    return out;
  }
}

// Quantizes one block of up to 32 dims of a row with a whole warp: lane i holds dim d0 + i
// (`active` false past the row's end). Same arithmetic as core/kv_quant.cc's kv_quantize_row.
template <int T>
__device__ __forceinline__ void kv_quantize_block(float x, bool active, int d0, uint8_t* codes,
                                                  half* params) {
  static_assert(T == kKvQ8 || T == kKvQ4, "only q8/q4 rows are quantized");
  const int lane = threadIdx.x & 31;
  if (!isfinite(x)) x = 0.0f;
  const int block = d0 >> 5;
  if constexpr (T == kKvQ8) {
    float amax = active ? fabsf(x) : 0.0f;
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const half sh = __float2half_rn(fminf(amax / 127.0f, 65504.0f));
    const float scale = __half2float(sh);
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    const float c = fminf(fmaxf(rintf(__fmul_rn(x, inv)), -127.0f), 127.0f);
    if (active) reinterpret_cast<int8_t*>(codes)[d0 + lane] = static_cast<int8_t>(c);
    if (lane == 0) params[block] = sh;
  } else {
    float lo = active ? x : INFINITY, hi = active ? x : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) {
      lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
      hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
    }
    const half mh = __float2half_rn(fminf(fmaxf(lo, -65504.0f), 65504.0f));
    const float mn = __half2float(mh);
    const half sh = __float2half_rn(fminf((hi - mn) / 15.0f, 65504.0f));
    const float scale = __half2float(sh);
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    const unsigned c =
        static_cast<unsigned>(fminf(fmaxf(rintf(__fmul_rn(x - mn, inv)), 0.0f), 15.0f));
    const unsigned hi_nibble = __shfl_down_sync(0xffffffffu, c, 1);
    const bool has_partner = __shfl_down_sync(0xffffffffu, active ? 1 : 0, 1) != 0;
    if (active && (lane & 1) == 0)
      codes[(d0 + lane) >> 1] =
          static_cast<uint8_t>(c | ((has_partner && lane < 31 ? hi_nibble : 0u) << 4));
    if (lane == 0) {
      params[2 * block] = sh;
      params[2 * block + 1] = mh;
    }
  }
}

// Row policy of the contiguous cache (attention.cu, attention_prefill.cu): key j of KV head h is
// row h * max_seq + j of the planes. (The paged policy is in paged_attention.cu.)
struct ContiguousKv {
  static constexpr bool kContiguous = true;
  const void *k, *v;
  const half *kp, *vp;
  int64_t base;  // kv_head * max_seq
  __device__ __forceinline__ int64_t row(int j) const { return base + j; }
};
__device__ __forceinline__ ContiguousKv contiguous_kv(const AttentionArgs& a, int kv_head) {
  return {a.k_cache, a.v_cache, a.k_params, a.v_params, static_cast<int64_t>(kv_head) * a.max_seq};
}

// Where a store kernel writes: one layer's key and value planes.
struct KvPlanes {
  void* k_codes = nullptr;
  void* v_codes = nullptr;
  half* k_params = nullptr;  // null for FP16
  half* v_params = nullptr;
};

// The body of the store kernels (contiguous and paged): k, v [n][n_kv][D] to the rows
// row_of(token, kv head) of the planes, quantizing for q8/q4. One warp per (token, KV head,
// block of 32 dims, k or v), lane = dim: the quantizer's block reductions are warp shuffles
// (loop trip counts are warp-uniform).
template <int T, class RowOf>
__device__ __forceinline__ void kv_store_rows(const KvPlanes& p, const half* k, const half* v,
                                              int n, int n_kv, int D, const RowOf& row_of) {
  const int blocks = (D + 31) / 32;
  const int64_t warps = static_cast<int64_t>(n) * n_kv * blocks * 2;
  const int lane = threadIdx.x & 31;
  for (int64_t w = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5; w < warps;
       w += (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5) {
    const int kv = static_cast<int>(w & 1);
    const int64_t rest = w >> 1;
    const int b = static_cast<int>(rest % blocks);
    const int h = static_cast<int>((rest / blocks) % n_kv);
    const int t = static_cast<int>(rest / (static_cast<int64_t>(blocks) * n_kv));
    const int d = b * 32 + lane;
    const bool active = d < D;
    const half* src = (kv ? v : k) + (static_cast<int64_t>(t) * n_kv + h) * D;
    const int64_t row = row_of(t, h);
    uint8_t* codes =
        static_cast<uint8_t*>(kv ? p.v_codes : p.k_codes) + row * kv_code_bytes_of<T>(D);
    if constexpr (T == kKvF16) {
      if (active) reinterpret_cast<half*>(codes)[d] = src[d];
    } else {
      const float x = active ? __half2float(src[d]) : 0.0f;
      half* params = (kv ? p.v_params : p.k_params) + row * kv_param_halves_of<T>(D);
      kv_quantize_block<T>(x, active, b * 32, codes, params);
    }
  }
}

// Threads for a store of n tokens (one warp per block of 32 dims of each k and v row).
inline int64_t kv_store_threads(int n, int n_kv, int D) {
  return static_cast<int64_t>(n) * n_kv * ((D + 31) / 32) * 2 * 32;
}

}  // namespace gyre::cuda
