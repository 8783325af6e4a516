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
// 4-bit (tiled layout): q.x, q.y are words 2h, 2h+1 of one lane piece (rows g, g+8 of a tile
// x 8 columns) with s/m for both rows; 8-bit: one chunk of one row, s[0]/m[0].
template <int BITS>
struct Prefetch {
  uint4 x[2];
  uint4 q;
  __half2 s[2], m[2];
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
  if constexpr (BITS == 4) {
    // 8 tiles x 32 lanes: each thread takes the half (8 bytes) of its lane piece for k0.
    const int tile = min(row0 / 16 + tid / 32, p.tiles - 1), lane = tid % 32;
    const int b = k0 / 64, h = (k0 % 64) / 32;
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(
        p.qweight + ((int64_t{tile} * p.kblocks + b) * 32 + lane) * 16 + 8 * h));
    f.q = make_uint4(v.x, v.y, 0, 0);
    const int64_t sidx = (int64_t{tile} * p.groups_p + (k0 >> p.group_log2)) * 16 + 2 * (lane / 4);
    const float2 s = load_tile_pair(p.scales, p.scale_f32, sidx);
    const float2 m = p.asym ? load_tile_pair(p.mins, p.scale_f32, sidx) : make_float2(0.f, 0.f);
    f.s[0] = __float2half2_rn(s.x);
    f.s[1] = __float2half2_rn(s.y);
    f.m[0] = __float2half2_rn(m.x);
    f.m[1] = __float2half2_rn(m.y);
    return;
  }
  // Weights (8-bit): two chunks per row.
  constexpr int kChunkCols = BITS == 4 ? 32 : 16;
  const int per_row = kTileK / kChunkCols;
  if (tid < kTileRows * per_row) {
    const int row = min(row0 + tid / per_row, p.rows - 1);
    const int c = k0 + (tid % per_row) * kChunkCols;
    const int64_t row_bytes = static_cast<int64_t>(p.cols) * BITS / 8;
    f.q = load_stream(p.qweight + row * row_bytes + static_cast<int64_t>(c) * BITS / 8);
    load_scale(p, static_cast<int64_t>(row) * (p.cols / p.group) + c / p.group, f.s[0], f.m[0]);
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
  if constexpr (BITS == 4) {
    // Rows g, g+8 of the thread's tile, columns 8t .. 8t+7 of this 32-column step.
    const int lane = tid % 32, r0 = (tid / 32) * 16 + lane / 4, c = (lane % 4) * 8;
    const __half2 lo_base = __float2half2_rn(p.asym ? 1024.f : 1032.f);
    const __half2 hi_base = __float2half2_rn(p.asym ? -64.f : -72.f);
    uint32_t a[2][4];
    int4_word_to_fragment(f.q.x, lo_base, hi_base, a[0]);
    int4_word_to_fragment(f.q.y, lo_base, hi_base, a[1]);
    __half2 row_g[4], row_g8[4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      row_g[2 * j] = __hfma2(as_half2(a[j][0]), f.s[0], f.m[0]);
      row_g[2 * j + 1] = __hfma2(as_half2(a[j][2]), f.s[0], f.m[0]);
      row_g8[2 * j] = __hfma2(as_half2(a[j][1]), f.s[1], f.m[1]);
      row_g8[2 * j + 1] = __hfma2(as_half2(a[j][3]), f.s[1], f.m[1]);
    }
    memcpy(&ws[r0][c], row_g, 16);
    memcpy(&ws[r0 + 8][c], row_g8, 16);
    return;
  }
  constexpr int kChunkCols = BITS == 4 ? 32 : 16;
  const int per_row = kTileK / kChunkCols;
  if (tid < kTileRows * per_row) {
    __half2 w[kChunkCols / 2];
    dequant_chunk<BITS>(f.q, f.s[0], f.m[0], p.asym, w);
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
          store_out(p, tok, row, v);
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
