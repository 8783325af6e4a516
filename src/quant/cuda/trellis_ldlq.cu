// The trellis LDLQ on the GPU (quant/cuda/trellis_ldlq.h): the loop of gptq_trellis.cc with one
// launch per step over all rows. Per 16-column block: the scales of a group at its first block
// (one thread per row), the tiles' targets in sequence-position order, the Viterbi of every tile
// of the block at once (trellis_cuda.cu), then one thread per row decodes its 16 values, solves
// E U[b, b] = T - Q and updates the rest of the 128-column block; one float64 GEMM per 128
// columns applies the lazy update beyond it (as gptq_cuda.cu). Stacked candidates (other K, or
// other weights) are extra rows of every launch but the encoder's, whose kernel is per K: each
// candidate's encoder runs on its own stream, forked from and joined back into the main one.
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
  int64_t big_r, rows;  // stacked rows, rows per candidate
  int n, i1, j, i2, group;
  int k[kMaxTrellisStack];
  int64_t block_off[kMaxTrellisStack], words_off[kMaxTrellisStack];  // candidates' offsets
  const uint32_t* block_words;  // per candidate [rows / 16][8K] of this block column
  uint32_t* words;              // per candidate [rows / 16][n / 16][8K]
  const float* scale;
  const double* u;
  double* err;  // [big_r x kLazyBlock] column-major
  float* dequant;
};

__global__ void block_solve(SolveArgs a) {
  const int64_t sr = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;  // stacked row
  if (sr >= a.big_r) return;
  const int cand = static_cast<int>(sr / a.rows);
  const int64_t r = sr - cand * a.rows, tile = r / kTile, R = a.big_r;
  const int k = a.k[cand], row = static_cast<int>(r % kTile), nw = 8 * k;
  const int nbits = kTrellisTileElems * k;
  const uint32_t* tw = a.block_words + a.block_off[cand] + tile * nw;
  if (row == 0) {
    uint32_t* out = a.words + a.words_off[cand] + (tile * (a.n / kTile) + a.j / kTile) * nw;
    for (int i = 0; i < nw; ++i) out[i] = tw[i];
  }
  const float s = a.scale[(a.j / a.group) * R + sr];
  double e[kTile];
  for (int c = 0; c < kTile; ++c) {
    const int b = k * position_of(row, c);
    const int wi = b >> 5, sh = b & 31;
    const uint64_t win = tw[wi] | (static_cast<uint64_t>(tw[(wi + 1) % (nbits >> 5)]) << 32);
    const uint32_t state = static_cast<uint32_t>(win >> sh) & 0xFFFFu;
    const uint32_t x = state * kTrellisMul + kTrellisAdd;
    const float q = s * static_cast<float>(__dp4a(static_cast<int>(x), 0x01010101, 0));
    const int64_t col = a.j + c;
    a.dequant[sr + col * R] = q;
    double acc = a.w[sr + col * R] - q;
    for (int i = 0; i < c; ++i) acc -= e[i] * a.u[int64_t{a.j + i} * a.n + col];
    e[c] = acc / a.u[col * a.n + col];
    a.err[sr + (col - a.i1) * R] = e[c];
  }
  for (int64_t col = a.j + kTile; col < a.i2; ++col) {
    double acc = a.w[sr + col * R];
    for (int c = 0; c < kTile; ++c) acc -= e[c] * a.u[int64_t{a.j + c} * a.n + col];
    a.w[sr + col * R] = acc;
  }
}

void ensure_side_streams(TrellisLdlqBuffers& b, int cands) {
  if (b.fork == nullptr) GYRE_CUDA_CHECK(cudaEventCreateWithFlags(&b.fork, cudaEventDisableTiming));
  for (int c = 0; c < cands; ++c) {
    if (b.side[c] == nullptr)
      GYRE_CUDA_CHECK(cudaStreamCreateWithFlags(&b.side[c], cudaStreamNonBlocking));
    if (b.join[c] == nullptr)
      GYRE_CUDA_CHECK(cudaEventCreateWithFlags(&b.join[c], cudaEventDisableTiming));
  }
}

}  // namespace

TrellisLdlqBuffers::~TrellisLdlqBuffers() {
  for (cudaStream_t& st : side)
    if (st != nullptr) cudaStreamDestroy(st);
  for (cudaEvent_t& ev : join)
    if (ev != nullptr) cudaEventDestroy(ev);
  if (fork != nullptr) cudaEventDestroy(fork);
}

void trellis_ldlq_device(cublasHandle_t blas, cudaStream_t s, double* w, int64_t rows, int cands,
                         const int* ks, int n, const double* u, int group, double scale_fit,
                         float* dequant, float* scale, uint32_t* words, int* bad,
                         TrellisLdlqBuffers& bufs) {
  GYRE_CHECK(cands >= 1 && cands <= kMaxTrellisStack, "trellis: ", cands,
             " stacked candidates (at most ", kMaxTrellisStack, ")");
  GYRE_CHECK(rows > 0 && rows % kTile == 0 && n > 0 && n % kTile == 0 &&
                 (group == 32 || group == 64 || group == 128) && n % group == 0,
             "trellis: a [", rows, ", ", n, "] weight with groups of ", group,
             " is not made of 16 x 16 tiles");
  const int64_t tiles = rows / kTile, big_r = rows * cands;
  const int64_t elems = tiles * cands * kTrellisTileElems;
  SolveArgs a{};
  a.w = w;
  a.big_r = big_r;
  a.rows = rows;
  a.n = n;
  a.group = group;
  a.words = words;
  a.scale = scale;
  a.u = u;
  a.err = bufs.err.as<double>(static_cast<size_t>(big_r) * kLazyBlock);
  a.dequant = dequant;
  int64_t block_words = 0, all_words = 0;
  for (int c = 0; c < cands; ++c) {
    GYRE_CHECK(trellis_bits_supported(ks[c]), "trellis: unsupported bits per weight ", ks[c]);
    a.k[c] = ks[c];
    a.block_off[c] = block_words;
    a.words_off[c] = all_words;
    block_words += tiles * 8 * ks[c];
    all_words += tiles * (n / kTile) * 8 * ks[c];
  }
  // Runs of consecutive candidates with one K: [run_first[i], run_first[i + 1]).
  int run_first[kMaxTrellisRuns + 1], runs = 0;
  for (int c = 0; c < cands; ++c)
    if (c == 0 || ks[c] != ks[c - 1]) {
      GYRE_CHECK(runs < kMaxTrellisRuns, "trellis: more than ", kMaxTrellisRuns,
                 " runs of one K in a stack");
      run_first[runs++] = c;
    }
  run_first[runs] = cands;
  float* t = bufs.target.as<float>(static_cast<size_t>(elems));
  float* sc = bufs.tile_scale.as<float>(static_cast<size_t>(elems));
  uint32_t* bw = bufs.tile_words.as<uint32_t>(static_cast<size_t>(block_words));
  a.block_words = bw;
  if (runs > 1) ensure_side_streams(bufs, runs);
  const double minus_one = -1.0, one = 1.0;
  for (int i1 = 0; i1 < n; i1 += kLazyBlock) {
    const int i2 = std::min(n, i1 + kLazyBlock);
    a.i1 = i1;
    a.i2 = i2;
    for (int j = i1; j < i2; j += kTile) {
      a.j = j;
      // A group lies inside one 128-column block, so here its columns hold every update so far.
      if (j % group == 0) {
        group_scales<<<blocks(big_r), kThreads, 0, s>>>(w, big_r, j, group, scale_fit, scale, bad);
        GYRE_CUDA_LAUNCHED();
      }
      tile_targets<<<blocks(elems), kThreads, 0, s>>>(w, big_r, j, group, scale, t, sc);
      GYRE_CUDA_LAUNCHED();
      if (runs == 1) {
        trellis_encode_tiles_device(t, sc, tiles * cands, ks[0], bw, nullptr, &bufs.workspace[0],
                                    s);
      } else {
        GYRE_CUDA_CHECK(cudaEventRecord(bufs.fork, s));
        for (int i = 0; i < runs; ++i) {
          const int c = run_first[i];
          GYRE_CUDA_CHECK(cudaStreamWaitEvent(bufs.side[i], bufs.fork, 0));
          const int64_t at = c * tiles * kTrellisTileElems;
          trellis_encode_tiles_device(t + at, sc + at, tiles * (run_first[i + 1] - c), ks[c],
                                      bw + a.block_off[c], nullptr, &bufs.workspace[i],
                                      bufs.side[i]);
          GYRE_CUDA_CHECK(cudaEventRecord(bufs.join[i], bufs.side[i]));
          GYRE_CUDA_CHECK(cudaStreamWaitEvent(s, bufs.join[i], 0));
        }
      }
      block_solve<<<blocks(big_r), kThreads, 0, s>>>(a);
      GYRE_CUDA_LAUNCHED();
    }
    if (i2 < n)  // w[:, i2:] -= err @ U[i1:i2, i2:] (U row-major is U^T column-major)
      GYRE_CUBLAS_CHECK(cublasDgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(big_r), n - i2,
                                    i2 - i1, &minus_one, a.err, static_cast<int>(big_r),
                                    u + i2 + int64_t{i1} * n, n, &one, w + int64_t{i2} * big_r,
                                    static_cast<int>(big_r)));
  }
}

}  // namespace gyre::quant::cuda
