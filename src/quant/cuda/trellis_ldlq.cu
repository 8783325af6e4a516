// The trellis LDLQ on the GPU (quant/cuda/trellis_ldlq.h): the loop of gptq_trellis.cc with one
// launch per step over all rows. Per 16-column block: the scales of a group at its first block
// (one thread per row), the tiles' targets in sequence-position order, the Viterbi of every tile
// of the block at once (trellis_cuda.cu), then one thread per row decodes its 16 values, solves
// E U[b, b] = T - Q and updates the rest of the 128-column block; one float64 GEMM per 128
// columns applies the lazy update beyond it (as gptq_cuda.cu).
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cpu/trellis.h"
#include "quant/cuda/trellis_cuda.h"
#include "quant/cuda/trellis_ldlq.h"

namespace gyre::quant::cuda {
namespace {

constexpr int kTile = kTrellisTileDim;
constexpr int kLazyBlock = 128;
constexpr int kThreads = 128;

unsigned blocks(int64_t count) {
  return static_cast<unsigned>((count + kThreads - 1) / kThreads);
}

// trellis_group_scale of gptq_trellis.cc for row r's group starting at column c0.
__global__ void group_scales(const double* w, int64_t rows, int c0, int group, double fit,
                             float* scale, int* bad) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (r >= rows) return;
  double ss = 0.0;
  for (int c = c0; c < c0 + group; ++c) {
    const double v = w[r + c * rows];
    ss += v * v;
  }
  const double s = sqrt(ss / group) / kTrellisCodeRms * fit;
  const float h = __half2float(__float2half_rn(static_cast<float>(s)));
  if (!isfinite(h)) *bad = 1;
  scale[(c0 / group) * rows + r] = h;
}

// t, sc [rows / 16][256]: the targets and scales of block column j's tiles, position order.
__global__ void tile_targets(const double* w, int64_t rows, int j, int group, const float* scale,
                             float* t, float* sc) {
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (idx >= rows * kTile) return;  // rows / 16 tiles of 256
  const int64_t tile = idx / kTrellisTileElems;
  const int p = static_cast<int>(idx % kTrellisTileElems);
  const int l = p >> 3, jj = p & 7, g = l >> 2, tq = l & 3;  // trellis_position
  const int row = g + ((jj & 2) ? 8 : 0), col = 2 * tq + (jj & 1) + ((jj & 4) ? 8 : 0);
  const int64_t r = tile * kTile + row;
  t[idx] = static_cast<float>(w[r + (j + col) * rows]);
  sc[idx] = scale[(j / group) * rows + r];
}

// Sequence position of (row, col) in a tile: the inverse of trellis_position.
__device__ int position_of(int row, int col) {
  const int l = (row & 7) * 4 + ((col & 7) >> 1);
  return 8 * l + ((col & 1) | ((row >> 3) << 1) | ((col >> 3) << 2));
}

struct SolveArgs {
  double* w;
  int64_t rows;
  int n, i1, j, i2, k, group;
  const uint32_t* block_words;  // [rows / 16][8K] of this block column
  uint32_t* words;              // [rows / 16][n / 16][8K]
  const float* scale;
  const double* u;
  double* err;  // [rows x kLazyBlock] column-major
  float* dequant;
};

__global__ void block_solve(SolveArgs a) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (r >= a.rows) return;
  const int64_t tile = r / kTile;
  const int row = static_cast<int>(r % kTile), nw = 8 * a.k, nbits = kTrellisTileElems * a.k;
  const uint32_t* tw = a.block_words + tile * nw;
  if (row == 0) {
    uint32_t* out = a.words + (tile * (a.n / kTile) + a.j / kTile) * nw;
    for (int i = 0; i < nw; ++i) out[i] = tw[i];
  }
  const float s = a.scale[(a.j / a.group) * a.rows + r];
  double e[kTile];
  for (int c = 0; c < kTile; ++c) {
    const int b = a.k * position_of(row, c);
    const int wi = b >> 5, sh = b & 31;
    const uint64_t win = tw[wi] | (static_cast<uint64_t>(tw[(wi + 1) % (nbits >> 5)]) << 32);
    const uint32_t state = static_cast<uint32_t>(win >> sh) & 0xFFFFu;
    const uint32_t x = state * kTrellisMul + kTrellisAdd;
    const float q = s * static_cast<float>(__dp4a(static_cast<int>(x), 0x01010101, 0));
    const int64_t col = a.j + c;
    a.dequant[r + col * a.rows] = q;
    double acc = a.w[r + col * a.rows] - q;
    for (int i = 0; i < c; ++i) acc -= e[i] * a.u[int64_t{a.j + i} * a.n + col];
    e[c] = acc / a.u[col * a.n + col];
    a.err[r + (col - a.i1) * a.rows] = e[c];
  }
  for (int64_t col = a.j + kTile; col < a.i2; ++col) {
    double acc = a.w[r + col * a.rows];
    for (int c = 0; c < kTile; ++c) acc -= e[c] * a.u[int64_t{a.j + c} * a.n + col];
    a.w[r + col * a.rows] = acc;
  }
}

}  // namespace

void trellis_ldlq_device(cublasHandle_t blas, cudaStream_t s, double* w, int64_t rows, int n,
                         const double* u, int k, int group, double scale_fit, float* dequant,
                         float* scale, uint32_t* words, int* bad, TrellisLdlqBuffers& bufs) {
  GYRE_CHECK(trellis_bits_supported(k), "trellis: unsupported bits per weight ", k);
  GYRE_CHECK(rows > 0 && rows % kTile == 0 && n > 0 && n % kTile == 0 &&
                 (group == 32 || group == 64 || group == 128) && n % group == 0,
             "trellis: a [", rows, ", ", n, "] weight with groups of ", group,
             " is not made of 16 x 16 tiles");
  const int64_t tiles = rows / kTile, elems = tiles * kTrellisTileElems;
  SolveArgs a{};
  a.w = w;
  a.rows = rows;
  a.n = n;
  a.k = k;
  a.group = group;
  a.words = words;
  a.scale = scale;
  a.u = u;
  a.err = bufs.err.as<double>(static_cast<size_t>(rows) * kLazyBlock);
  a.dequant = dequant;
  float* t = bufs.target.as<float>(static_cast<size_t>(elems));
  float* sc = bufs.tile_scale.as<float>(static_cast<size_t>(elems));
  uint32_t* bw = bufs.tile_words.as<uint32_t>(static_cast<size_t>(tiles) * 8 * k);
  a.block_words = bw;
  const double minus_one = -1.0, one = 1.0;
  for (int i1 = 0; i1 < n; i1 += kLazyBlock) {
    const int i2 = std::min(n, i1 + kLazyBlock);
    a.i1 = i1;
    a.i2 = i2;
    for (int j = i1; j < i2; j += kTile) {
      a.j = j;
      // A group lies inside one 128-column block, so here its columns hold every update so far.
      if (j % group == 0) {
        group_scales<<<blocks(rows), kThreads, 0, s>>>(w, rows, j, group, scale_fit, scale, bad);
        GYRE_CUDA_LAUNCHED();
      }
      tile_targets<<<blocks(elems), kThreads, 0, s>>>(w, rows, j, group, scale, t, sc);
      GYRE_CUDA_LAUNCHED();
      trellis_encode_tiles_device(t, sc, tiles, k, bw, nullptr, &bufs.workspace, s);
      block_solve<<<blocks(rows), kThreads, 0, s>>>(a);
      GYRE_CUDA_LAUNCHED();
    }
    if (i2 < n)  // w[:, i2:] -= err @ U[i1:i2, i2:] (U row-major is U^T column-major)
      GYRE_CUBLAS_CHECK(cublasDgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(rows), n - i2,
                                    i2 - i1, &minus_one, a.err, static_cast<int>(rows),
                                    u + i2 + int64_t{i1} * n, n, &one, w + int64_t{i2} * rows,
                                    static_cast<int>(rows)));
  }
}

}  // namespace gyre::quant::cuda
