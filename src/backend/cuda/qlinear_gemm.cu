// Quantized GEMM for prefill: y[n, rows] = x[n, cols] W^T on the tensor cores (WMMA 16x16x16,
// FP16 in, float accumulators). A block computes 128 tokens x 128 weight rows; per 32-column
// step it dequantizes the weight tile into shared memory, with the next step's global loads
// issued into registers before the current step's matrix products (two shared buffers).
#include <mma.h>

#include "backend/cuda/qlinear_kernels.cuh"

namespace gyre::qlinear_detail {

void check_cuda(cudaError_t e, const char* what);  // qlinear.cu

namespace {

constexpr int kTileTokens = 128, kTileRows = 128, kTileK = 32;
constexpr int kLd = kTileK + 8;  // padded row (80 bytes) against bank conflicts
constexpr int kThreads = 256;

// The global data of one k-step held in registers until it is stored to shared memory.
template <int BITS>
struct Prefetch {
  uint4 x[2];
  uint4 q;
  __half2 s, m;
};

template <int BITS>
__device__ __forceinline__ void fetch(const Params& p, int tok0, int row0, int k0,
                                      Prefetch<BITS>& f) {
  const int tid = threadIdx.x;
  // x: 128 tokens x 32 columns = 512 vectors of 8 halves, two per thread.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int idx = tid + i * kThreads, tok = tok0 + idx / 4, c = k0 + (idx % 4) * 8;
    if (tok >= p.n) {
      f.x[i] = make_uint4(0, 0, 0, 0);
    } else if (p.perm == nullptr) {
      f.x[i] = __ldg(reinterpret_cast<const uint4*>(p.x + static_cast<int64_t>(tok) * p.cols + c));
    } else {
      __half2 h[4];
      load_x<8>(p, tok, c, h);
      memcpy(&f.x[i], h, 16);
    }
  }
  // Weights: 4-bit: one chunk per row (threads 0..127); 8-bit: two chunks per row.
  constexpr int kChunkCols = BITS == 4 ? 32 : 16;
  const int per_row = kTileK / kChunkCols;
  if (tid < kTileRows * per_row) {
    const int row = min(row0 + tid / per_row, p.rows - 1);
    const int c = k0 + (tid % per_row) * kChunkCols;
    const int64_t row_bytes = static_cast<int64_t>(p.cols) * BITS / 8;
    f.q = load_stream(p.qweight + row * row_bytes + static_cast<int64_t>(c) * BITS / 8);
    load_scale(p, static_cast<int64_t>(row) * (p.cols / p.group) + c / p.group, f.s, f.m);
  }
}

template <int BITS>
__device__ __forceinline__ void store(const Params& p, const Prefetch<BITS>& f, __half (*xs)[kLd],
                                      __half (*ws)[kLd]) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int idx = tid + i * kThreads;
    *reinterpret_cast<uint4*>(&xs[idx / 4][(idx % 4) * 8]) = f.x[i];
  }
  constexpr int kChunkCols = BITS == 4 ? 32 : 16;
  const int per_row = kTileK / kChunkCols;
  if (tid < kTileRows * per_row) {
    __half2 w[kChunkCols / 2];
    dequant_chunk<BITS>(f.q, f.s, f.m, p.asym, w);
    uint4* dst = reinterpret_cast<uint4*>(&ws[tid / per_row][(tid % per_row) * kChunkCols]);
#pragma unroll
    for (int j = 0; j < kChunkCols / 8; ++j) memcpy(&dst[j], &w[4 * j], 16);
  }
}

template <int BITS>
__global__ void __launch_bounds__(kThreads) gemm_kernel(Params p) {
  using namespace nvcuda;
  __shared__ __align__(128) __half xs[2][kTileTokens][kLd];
  __shared__ __align__(128) __half ws[2][kTileRows][kLd];
  const int row0 = blockIdx.x * kTileRows, tok0 = blockIdx.y * kTileTokens;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / 4, wn = warp % 4;  // warp tile: 64 tokens x 32 rows

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4][2];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  Prefetch<BITS> f;
  fetch<BITS>(p, tok0, row0, 0, f);
  store<BITS>(p, f, xs[0], ws[0]);
  __syncthreads();
  const int steps = p.cols / kTileK;
  for (int step = 0; step < steps; ++step) {
    const int cur = step & 1;
    if (step + 1 < steps) fetch<BITS>(p, tok0, row0, (step + 1) * kTileK, f);
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a[4];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b[2];
#pragma unroll
      for (int i = 0; i < 4; ++i) wmma::load_matrix_sync(a[i], &xs[cur][wm * 64 + i * 16][kk], kLd);
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b[j], &ws[cur][wn * 32 + j * 16][kk], kLd);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    }
    if (step + 1 < steps) store<BITS>(p, f, xs[cur ^ 1], ws[cur ^ 1]);
    __syncthreads();
  }

  // Epilogue: each warp stages one 16x16 fragment at a time in the (now free) x buffer.
  float* stage = reinterpret_cast<float*>(&xs[0][0][0]) + warp * 256;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      wmma::store_matrix_sync(stage, acc[i][j], 16, wmma::mem_row_major);
      __syncwarp();
#pragma unroll
      for (int e = lane; e < 256; e += 32) {
        const int tok = tok0 + wm * 64 + i * 16 + e / 16;
        const int row = row0 + wn * 32 + j * 16 + e % 16;
        if (tok < p.n && row < p.rows) {
          float v = stage[e];
          if (p.bias != nullptr) v += __half2float(p.bias[row]);
          p.y[static_cast<int64_t>(tok) * p.rows + row] = __float2half_rn(v);
        }
      }
      __syncwarp();
    }
  }
}

}  // namespace

void launch_gemm(const Params& p, cudaStream_t stream) {
  // cols is a multiple of the group (>= 16); only 8-bit g16 weights can miss a 32-column step.
  if (p.cols % kTileK != 0) {
    check_cuda(cudaErrorInvalidValue, "qlinear_gemm (columns must be a multiple of 32)");
  }
  const dim3 grid((p.rows + kTileRows - 1) / kTileRows, (p.n + kTileTokens - 1) / kTileTokens);
  if (grid.y > 65535) check_cuda(cudaErrorInvalidValue, "qlinear_gemm (n too large)");
  if (p.bits == 4) {
    gemm_kernel<4><<<grid, kThreads, 0, stream>>>(p);
  } else {
    gemm_kernel<8><<<grid, kThreads, 0, stream>>>(p);
  }
}

}  // namespace gyre::qlinear_detail
