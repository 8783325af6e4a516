#include "backend/cpu/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <vector>

#include "core/error.h"
#include "core/half.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace gyre {

namespace {

constexpr int kLanes = 8;

inline float reduce_lanes(const float* acc) {
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// Eight f32 lanes (one AVX register with -march=x86-64-v3; the compiler splits it otherwise).
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));
typedef uint16_t Halves __attribute__((vector_size(kLanes * sizeof(uint16_t))));
typedef uint32_t Words __attribute__((vector_size(kLanes * sizeof(uint32_t))));

// Weight element types a tile reads directly; conversions to f32 are exact, so a tile gives the
// same sums whether its weights were converted beforehand or on the fly.
struct Bf16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};

inline float to_float(float v) {
  return v;
}
inline float to_float(Bf16 v) {
  return bf16_to_f32(v.bits);
}
inline float to_float(F16 v) {
  return f16_to_f32(v.bits);
}

// Loads return through a reference: a 32-byte vector returned by value would change the ABI
// (and warn) in builds without AVX.
inline void load_lanes(Lanes& v, const float* p) {
  std::memcpy(&v, p, sizeof(v));
}

inline void load_lanes(Lanes& v, const Bf16* p) {
  Halves h;
  std::memcpy(&h, p, sizeof(h));
  const Words u = __builtin_convertvector(h, Words) << 16;
  std::memcpy(&v, &u, sizeof(v));
}

inline void load_lanes(Lanes& v, const F16* p) {
#if defined(__F16C__)
  const __m256 f = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  std::memcpy(&v, &f, sizeof(v));
#else
  for (int j = 0; j < kLanes; ++j) v[j] = f16_to_f32(p[j].bits);
#endif
}

// R weight rows by T tokens: R * T dot products of length cols, each summed in the common order.
// Explicit lane vectors, so that every tile shape compiles to the same per-lane arithmetic.
template <int R, int T, typename W>
void tile(const W* const* w, const float* const* x, int64_t cols, float (&sums)[R][T]) {
  Lanes acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = Lanes{};
  const int64_t full = cols - cols % kLanes;
  for (int64_t i = 0; i < full; i += kLanes) {
    Lanes xv[T];
    for (int t = 0; t < T; ++t) load_lanes(xv[t], x[t] + i);
    for (int r = 0; r < R; ++r) {
      Lanes wv;
      load_lanes(wv, w[r] + i);
      for (int t = 0; t < T; ++t) acc[r][t] += wv * xv[t];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) {
      float lanes[kLanes];
      std::memcpy(lanes, &acc[r][t], sizeof(lanes));
      float s = reduce_lanes(lanes);
      // An explicit fma: whether the compiler would contract s += w * x must not depend on W.
      for (int64_t i = full; i < cols; ++i) s = std::fma(to_float(w[r][i]), x[t][i], s);
      sums[r][t] = s;
    }
}

template <int R, int T, typename W>
void tile_store(const W* const* w, const float* const* x, int64_t cols, float* out,
                int64_t out_stride, int64_t o, int64_t t0) {
  float sums[R][T];
  tile<R, T>(w, x, cols, sums);
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) out[(t0 + t) * out_stride + o + r] = sums[r][t];
}

// Up to 4 tokens against R weight rows.
template <int R, typename W>
void tile_tokens(int n, const W* const* w, const float* const* x, int64_t cols, float* out,
                 int64_t out_stride, int64_t o, int64_t t0) {
  switch (n) {
    case 4:
      return tile_store<R, 4>(w, x, cols, out, out_stride, o, t0);
    case 3:
      return tile_store<R, 3>(w, x, cols, out, out_stride, o, t0);
    case 2:
      return tile_store<R, 2>(w, x, cols, out, out_stride, o, t0);
    default:
      return tile_store<R, 1>(w, x, cols, out, out_stride, o, t0);
  }
}

// Every token of x against weight rows [o_begin, o_end), given as row pointers.
template <typename W>
void matmul_group(const W* const* rows, int64_t n_rows, int64_t o_begin, const float* x,
                  int64_t n_tokens, int64_t token_block, int64_t cols, float* out,
                  int64_t out_stride) {
  for (int64_t t0 = 0; t0 < n_tokens; t0 += token_block) {
    const int64_t t1 = std::min(n_tokens, t0 + token_block);
    for (int64_t r = 0; r < n_rows; r += 2) {
      for (int64_t t = t0; t < t1; t += 4) {
        const int nt = static_cast<int>(std::min<int64_t>(4, t1 - t));
        const float* xr[4];
        for (int k = 0; k < nt; ++k) xr[k] = x + (t + k) * cols;
        if (r + 1 < n_rows)
          tile_tokens<2>(nt, rows + r, xr, cols, out, out_stride, o_begin + r, t);
        else
          tile_tokens<1>(nt, rows + r, xr, cols, out, out_stride, o_begin + r, t);
      }
    }
  }
}

// Scratch for weight rows converted from F16/BF16; one per thread, grown as needed.
float* thread_scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

}  // namespace

std::shared_ptr<void> alloc_aligned(size_t bytes) {
  constexpr std::align_val_t kAlign{64};
  void* p = ::operator new(std::max<size_t>(bytes, 1), kAlign);
  return std::shared_ptr<void>(p, [](void* q) { ::operator delete(q, kAlign); });
}

void convert_row_to_f32(DType t, const void* src, float* dst, int64_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16: {
      const auto* s = static_cast<const uint16_t*>(src);
      int64_t i = 0;
#if defined(__F16C__)
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i,
                         _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
#endif
      for (; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::BF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t u = static_cast<uint32_t>(s[i]) << 16;
        std::memcpy(dst + i, &u, sizeof(float));
      }
      return;
    }
    default:
      fail("the CPU backend cannot read ", dtype_name(t), " rows in place");
  }
}

float dot_f32(const float* a, const float* b, int64_t n) {
  float s[1][1];
  tile<1, 1>(&a, &b, n, s);
  return s[0][0];
}

void matmul_rows(float* out, int64_t out_stride, const float* x, int64_t n_tokens, const void* w,
                 DType w_type, int64_t cols, int64_t o_begin, int64_t o_end) {
  const size_t row_bytes = dtype_row_bytes(w_type, cols);
  const int64_t row_floats_bytes = std::max<int64_t>(cols * 4, 1);
  // Weight rows are taken in groups that stay in L2 while every block of tokens passes over
  // them; each block of tokens is small enough to stay in L2 beside them. So a weight row comes
  // from memory once per group, however many tokens there are.
  const int64_t group_rows = std::clamp<int64_t>((256 << 10) / row_floats_bytes, 2, 32) & ~1;
  const int64_t token_block = std::clamp<int64_t>((512 << 10) / row_floats_bytes, 4, 64) & ~3;
  // Half-precision rows are converted once per group when many tokens will reuse them, and read
  // directly (converted in registers) when few tokens do, as in decoding.
  const bool convert_first = w_type != DType::F32 && n_tokens > 4;
  float* scratch = convert_first ? thread_scratch(static_cast<size_t>(group_rows * cols)) : nullptr;

  for (int64_t g0 = o_begin; g0 < o_end; g0 += group_rows) {
    const int64_t g1 = std::min(o_end, g0 + group_rows), n_rows = g1 - g0;
    const void* rows[64];
    for (int64_t o = g0; o < g1; ++o) {
      const void* src = static_cast<const uint8_t*>(w) + static_cast<size_t>(o) * row_bytes;
      if (convert_first) {
        float* dst = scratch + (o - g0) * cols;
        convert_row_to_f32(w_type, src, dst, cols);
        src = dst;
      }
      rows[o - g0] = src;
    }
    const DType row_type = convert_first ? DType::F32 : w_type;
    if (row_type == DType::F32)
      matmul_group(reinterpret_cast<const float* const*>(rows), n_rows, g0, x, n_tokens,
                   token_block, cols, out, out_stride);
    else if (row_type == DType::BF16)
      matmul_group(reinterpret_cast<const Bf16* const*>(rows), n_rows, g0, x, n_tokens, token_block,
                   cols, out, out_stride);
    else if (row_type == DType::F16)
      matmul_group(reinterpret_cast<const F16* const*>(rows), n_rows, g0, x, n_tokens, token_block,
                   cols, out, out_stride);
    else
      fail("the CPU backend cannot multiply by ", dtype_name(w_type), " weights in place");
  }
}

}  // namespace gyre
