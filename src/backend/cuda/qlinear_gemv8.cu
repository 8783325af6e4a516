// The CUDA-core GEMV of the host layout (8-bit weights at n <= 4, decode) and its
// dequantization. GEMV work split: a block of kGemvWarps warps; each group of p.ksplit warps owns R
// weight rows and walks their 16-byte chunks with a stride of the group, so each warp reads 512
// contiguous bytes per row per step and the columns are split across the group's warps (a split-K
// inside the block, reduced in shared memory). ksplit is 1 when there are rows enough to fill the
// GPU, more for short matrices. Each lane keeps U * R chunk loads in flight before using any.
#include <cstring>

#include "backend/cuda/qlinear_internal.h"

namespace gyre::qlinear_detail {

namespace {

constexpr int kGemvWarps = 4;

template <int BITS, int NT, int R>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(Params p) {
  cuda::pdl_begin();  // launched with PDL (launch.h)
  using namespace qlinear_detail;
  constexpr int kCols = BITS == 4 ? 32 : 16;  // columns per 16-byte chunk
  constexpr int kPairs = kCols / 2;
  constexpr int kUnroll = NT <= 2 ? 4 : 2;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kStride = p.ksplit * 32;
  const int row0 = (blockIdx.x * (kGemvWarps / p.ksplit) + warp / p.ksplit) * R;
  const int chunks = p.cols / kCols;
  const int64_t row_bytes = static_cast<int64_t>(chunks) * 16;
  const int groups = p.cols / p.group;

  float acc[NT][R];
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[t][r] = 0.0f;

  for (int base = (warp % p.ksplit) * 32 + lane; base < chunks; base += kUnroll * kStride) {
    uint4 q[kUnroll][R];
    // Issue every load of this step before the first use.
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int ch = min(base + u * kStride, chunks - 1);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int row = min(row0 + r, p.rows - 1);
        q[u][r] = load_stream(p.qweight + row * row_bytes + static_cast<int64_t>(ch) * 16);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int ch = base + u * kStride;
      if (ch >= chunks) break;
      __half2 w[R][kPairs];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int row = min(row0 + r, p.rows - 1);
        __half2 s, m;
        load_scale(p, static_cast<int64_t>(row) * groups + ch * kCols / p.group, s, m);
        dequant_chunk<BITS>(q[u][r], s, m, p.asym, w[r]);
      }
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        __half2 xv[kPairs];
        load_x<kCols>(p, t, ch * kCols, xv);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          // At most kCols products in FP16 before the float accumulator takes them.
          __half2 a = __hmul2(w[r][0], xv[0]);
#pragma unroll
          for (int j = 1; j < kPairs; ++j) a = __hfma2(w[r][j], xv[j], a);
          const float2 f = __half22float2(a);
          acc[t][r] += f.x + f.y;
        }
      }
    }
  }

  __shared__ float partial[kGemvWarps][NT * R];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float v = acc[t][r];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0) partial[warp][t * R + r] = v;
    }
  }
  __syncthreads();
  if (threadIdx.x < kGemvWarps / p.ksplit * NT * R) {
    const int g = threadIdx.x / (NT * R), j = threadIdx.x % (NT * R);
    const int t = j / R, row = (blockIdx.x * (kGemvWarps / p.ksplit) + g) * R + j % R;
    if (row < p.rows) {
      float v = 0.0f;
      for (int wi = 0; wi < p.ksplit; ++wi) v += partial[g * p.ksplit + wi][j];
      if (p.bias != nullptr) v += __half2float(p.bias[row]);
      store_out<true>(p, t, row, v);
    }
  }
}

template <int BITS, int NT, int R>
void launch_gemv(const Params& p, cudaStream_t stream) {
  // Enough row groups to give every SM many warps: no split-K; fewer: split the columns.
  Params q = p;
  const int row_groups = (p.rows + R - 1) / R;
  q.ksplit = row_groups >= 2048 ? 1 : row_groups >= 1024 ? 2 : 4;
  const int per_block = R * (kGemvWarps / q.ksplit);
  const int blocks = (p.rows + per_block - 1) / per_block;
  qlaunch(gemv_kernel<BITS, NT, R>, blocks, kGemvWarps * 32, 0, stream, q);
}

template <int BITS>
void dispatch_gemv(const Params& p, int rows_per_block, cudaStream_t stream) {
  if (p.n == 1 && rows_per_block == 1) return launch_gemv<BITS, 1, 1>(p, stream);
  if (p.n == 1 && rows_per_block == 4) return launch_gemv<BITS, 1, 4>(p, stream);
  switch (p.n) {
    case 1:
      return launch_gemv<BITS, 1, 2>(p, stream);
    case 2:
      return launch_gemv<BITS, 2, 2>(p, stream);
    case 3:
      return launch_gemv<BITS, 3, 2>(p, stream);
    case 4:
      return launch_gemv<BITS, 4, 2>(p, stream);
    case 5:
      return launch_gemv<BITS, 5, 2>(p, stream);
    case 6:
      return launch_gemv<BITS, 6, 2>(p, stream);
    case 7:
      return launch_gemv<BITS, 7, 2>(p, stream);
    default:
      return launch_gemv<BITS, 8, 2>(p, stream);
  }
}

// One thread per chunk: dequantize and store in the original column order.
template <int BITS>
__global__ void dequant_kernel(Params p, __half* out) {
  using namespace qlinear_detail;
  constexpr int kCols = BITS == 4 ? 32 : 16;
  const int chunks = p.cols / kCols;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(p.rows) * chunks) return;
  const int64_t row = i / chunks;
  const int ch = static_cast<int>(i % chunks);
  __half2 s, m, w[kCols / 2];
  load_scale(p, row * (p.cols / p.group) + ch * kCols / p.group, s, m);
  dequant_chunk<BITS>(load_stream(p.qweight + i * 16), s, m, p.asym, w);
  __half* dst = out + row * p.cols;
  const int c0 = ch * kCols;
  if (p.perm == nullptr) {
    uint4* d4 = reinterpret_cast<uint4*>(dst + c0);
    for (int j = 0; j < kCols / 8; ++j) {
      uint4 v;
      memcpy(&v, &w[4 * j], 16);
      d4[j] = v;
    }
  } else {
    for (int j = 0; j < kCols / 2; ++j) {
      dst[p.perm[c0 + 2 * j]] = __low2half(w[j]);
      dst[p.perm[c0 + 2 * j + 1]] = __high2half(w[j]);
    }
  }
}

}  // namespace

void launch_gemv8(const Params& p, int rows_per_block, cudaStream_t stream) {
  dispatch_gemv<8>(p, rows_per_block, stream);
}

void launch_dequant8(const Params& p, __half* out, cudaStream_t stream) {
  const int64_t chunks = static_cast<int64_t>(p.rows) * (p.cols / 16);  // 16 columns per chunk
  const int threads = 256;
  const auto blocks = static_cast<unsigned>((chunks + threads - 1) / threads);
  dequant_kernel<8><<<blocks, threads, 0, stream>>>(p, out);
}

}  // namespace gyre::qlinear_detail
