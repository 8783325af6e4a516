// Decode-time linear layer: out[n, o] = x[n, i] . w[o, i] (+ bias) for n = 1..8 tokens, FP16
// weights and activations, f32 accumulation. Memory bound on the weights: one warp per output
// row streams the row with 16-byte loads (8 halves per lane, 512 bytes per warp per step), four
// loads in flight per lane before the first use, bypassing L1 for weights (read once) while x
// (reused by every warp) stays cached. The n token rows share each weight load.
// Rows whose length is not a multiple of 8 (tiny models) take a scalar path.
// Alternatives: splitting a row over several warps helps only very short, very many-row shapes;
// one warp per row already gives every SM dozens of rows for Llama shapes.
#include "backend/cuda/launch.h"

namespace gyre::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kUnroll = 4;

__device__ __forceinline__ uint4 load_streaming(const half* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

__device__ __forceinline__ float dot8(const uint4& w, const uint4& x) {
  const half2* wh = reinterpret_cast<const half2*>(&w);
  const half2* xh = reinterpret_cast<const half2*>(&x);
  float acc = 0.0f;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 wf = __half22float2(wh[e]), xf = __half22float2(xh[e]);
    acc = fmaf(wf.x, xf.x, acc);
    acc = fmaf(wf.y, xf.y, acc);
  }
  return acc;
}

// WPR warps share one row (each takes every WPR-th 512-byte step), so matrices with few rows
// (the K/V projections) still put enough loads in flight; partial sums meet in shared memory.
template <int N, int WPR>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    gemv_vec_kernel(half* __restrict__ out, const half* __restrict__ x, const half* __restrict__ w,
                    const half* __restrict__ bias, int out_dim, int in_dim) {
  pdl_begin();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row = blockIdx.x * (kWarpsPerBlock / WPR) + warp / WPR;
  const int part = warp % WPR;
  float acc[N];
#pragma unroll
  for (int t = 0; t < N; ++t) acc[t] = 0.0f;
  if (row < out_dim) {
    const half* wr = w + static_cast<int64_t>(row) * in_dim;
    constexpr int kStep = 32 * 8 * WPR;  // halves per row per load round of the WPR warps
    int c = (part * 32 + lane) * 8;
    for (; c + (kUnroll - 1) * kStep < in_dim; c += kUnroll * kStep) {
      uint4 wv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) wv[u] = load_streaming(wr + c + u * kStep);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int t = 0; t < N; ++t) {
          const uint4 xv = __ldg(
              reinterpret_cast<const uint4*>(x + static_cast<int64_t>(t) * in_dim + c + u * kStep));
          acc[t] += dot8(wv[u], xv);
        }
      }
    }
    for (; c < in_dim; c += kStep) {
      const uint4 wv = load_streaming(wr + c);
#pragma unroll
      for (int t = 0; t < N; ++t)
        acc[t] += dot8(
            wv, __ldg(reinterpret_cast<const uint4*>(x + static_cast<int64_t>(t) * in_dim + c)));
    }
  }
#pragma unroll
  for (int t = 0; t < N; ++t)
    for (int o = 16; o > 0; o >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
  if constexpr (WPR > 1) {
    __shared__ float partial[kWarpsPerBlock][N];
    if (lane == 0) {
#pragma unroll
      for (int t = 0; t < N; ++t) partial[warp][t] = acc[t];
    }
    __syncthreads();
    if (lane == 0 && part == 0) {
#pragma unroll
      for (int t = 0; t < N; ++t)
        for (int p = 1; p < WPR; ++p) acc[t] += partial[warp + p][t];
    }
  }
  if (lane == 0 && part == 0 && row < out_dim) {
#pragma unroll
    for (int t = 0; t < N; ++t) {
      float v = acc[t];
      if (bias) v += __half2float(bias[row]);
      out[static_cast<int64_t>(t) * out_dim + row] = __float2half(v);
    }
  }
}

__global__ void gemv_scalar_kernel(half* out, const half* x, const half* w, const half* bias, int n,
                                   int out_dim, int in_dim) {
  pdl_begin();
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= out_dim) return;
  const half* wr = w + static_cast<int64_t>(row) * in_dim;
  for (int t = 0; t < n; ++t) {
    float v = 0.0f;
    for (int c = lane; c < in_dim; c += 32)
      v += __half2float(wr[c]) * __half2float(x[static_cast<int64_t>(t) * in_dim + c]);
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) {
      if (bias) v += __half2float(bias[row]);
      out[static_cast<int64_t>(t) * out_dim + row] = __float2half(v);
    }
  }
}

template <int N, int WPR>
void launch_vec_wpr(half* out, const half* x, const half* w, const half* bias, int out_dim,
                    int in_dim, cudaStream_t s) {
  constexpr int kRowsPerBlock = kWarpsPerBlock / WPR;
  const unsigned blocks = static_cast<unsigned>((out_dim + kRowsPerBlock - 1) / kRowsPerBlock);
  launch(gemv_vec_kernel<N, WPR>, blocks, kWarpsPerBlock * 32, 0, s, out, x, w, bias, out_dim,
         in_dim);
}

// Measured on H100 (ncu, one warp per row): 4096x4096 at 64% of peak DRAM throughput and
// 1024x4096 at 27%, against 80% for the 14336-row matrices: fewer rows get more warps each.
template <int N>
void launch_vec(half* out, const half* x, const half* w, const half* bias, int out_dim, int in_dim,
                cudaStream_t s) {
  if (out_dim >= 8192 || in_dim < 2048)
    launch_vec_wpr<N, 1>(out, x, w, bias, out_dim, in_dim, s);
  else if (out_dim >= 2048)
    launch_vec_wpr<N, 2>(out, x, w, bias, out_dim, in_dim, s);
  else
    launch_vec_wpr<N, 4>(out, x, w, bias, out_dim, in_dim, s);
}

}  // namespace

void gemv(half* out, const half* x, const half* w, const half* bias, int n, int out_dim, int in_dim,
          cudaStream_t s) {
  GYRE_CHECK(n >= 1 && n <= kGemvMaxRows, "gemv takes 1..", kGemvMaxRows, " rows, got ", n);
  const bool aligned = in_dim % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(w) % 16 == 0;
  if (!aligned) {
    const unsigned blocks = static_cast<unsigned>((out_dim + kWarpsPerBlock - 1) / kWarpsPerBlock);
    launch(gemv_scalar_kernel, blocks, kWarpsPerBlock * 32, 0, s, out, x, w, bias, n, out_dim,
           in_dim);
    GYRE_CUDA_LAUNCHED();
    return;
  }
  switch (n) {
    case 1:
      launch_vec<1>(out, x, w, bias, out_dim, in_dim, s);
      break;
    case 2:
      launch_vec<2>(out, x, w, bias, out_dim, in_dim, s);
      break;
    case 3:
      launch_vec<3>(out, x, w, bias, out_dim, in_dim, s);
      break;
    case 4:
      launch_vec<4>(out, x, w, bias, out_dim, in_dim, s);
      break;
    case 5:
      launch_vec<5>(out, x, w, bias, out_dim, in_dim, s);
      break;
    case 6:
      launch_vec<6>(out, x, w, bias, out_dim, in_dim, s);
      break;
    case 7:
      launch_vec<7>(out, x, w, bias, out_dim, in_dim, s);
      break;
    default:
      launch_vec<8>(out, x, w, bias, out_dim, in_dim, s);
      break;
  }
  GYRE_CUDA_LAUNCHED();
}

}  // namespace gyre::cuda
