// The 4-bit tiled device layout: conversion from the host layout (qlinear_ref.h), the GEMV on
// tensor cores (n = 1..8 in one pass over the weight) and the dequantization to FP16.
//
// Layout. Rows are padded to tiles of 16, columns to blocks of 64. Tile T, block b occupies
// 512 contiguous bytes (one 16-byte load per lane of a warp), at ((T * kblocks + b) * 32 + L) *
// 16 for lane L = 4g + t (g = 0..7, t = 0..3). Lane L's 4 words are the A fragments of four
// m16n8k16 steps j = 0..3 for rows 16T + g and 16T + g + 8: step j covers the columns
// c = 64b + 32(j/2) + 8t + 4(j%2) + {0..3} (so steps 0-1 and 2-3 each stay inside 32 columns, one
// group even at group size 32, and lane t's x for two steps is 8 contiguous halves). In word j:
// bits 0-3 / 16-19: row g, columns c, c+1; 4-7 / 20-23: row g+8, c, c+1; 8-11 / 24-27: row g,
// c+2, c+3; 12-15 / 28-31: row g+8, c+2, c+3 (see int4_word_to_fragment). Padding holds zeros.
// Scales (and mins) are [tiles][groups_p][16] with the 16 rows ordered 0, 8, 1, 9, ..., 7, 15,
// padding zero (so padded weights contribute exactly 0 to any finite x).
#include <algorithm>

#include "backend/cuda/qlinear_kernels.cuh"

namespace gyre::qlinear_detail {

void check_cuda(cudaError_t e, const char* what);  // qlinear.cu

namespace {

// The nibble of packed column c of row r in the host layout (qlinear_ref.h), 0 when padding.
__device__ uint32_t host_nibble(const uint8_t* src, int rows, int cols, int r, int c) {
  if (r >= rows || c >= cols) return 0;
  const int64_t byte = int64_t{r} * (cols / 2) + (c / 32) * 16 + ((c % 32) / 8) * 4 +
                       (c % 2) * 2 + ((c % 8) / 2) / 2;
  return (src[byte] >> (((c % 8) / 2) % 2 * 4)) & 0xF;
}

__global__ void tile_weights_kernel(const uint8_t* src, uint32_t* dst, int rows, int cols,
                                    int kblocks, int64_t words) {
  const int64_t o = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (o >= words) return;
  const int j = static_cast<int>(o % 4), lane = static_cast<int>((o / 4) % 32);
  const int64_t tb = o / 128;
  const int b = static_cast<int>(tb % kblocks), tile = static_cast<int>(tb / kblocks);
  const int g = lane / 4, t = lane % 4;
  const int c = 64 * b + 32 * (j / 2) + 8 * t + 4 * (j % 2);
  const int r0 = 16 * tile + g, r1 = r0 + 8;
  const uint32_t v = host_nibble(src, rows, cols, r0, c) | host_nibble(src, rows, cols, r0, c + 1) << 16 |
                     host_nibble(src, rows, cols, r1, c) << 4 | host_nibble(src, rows, cols, r1, c + 1) << 20 |
                     host_nibble(src, rows, cols, r0, c + 2) << 8 | host_nibble(src, rows, cols, r0, c + 3) << 24 |
                     host_nibble(src, rows, cols, r1, c + 2) << 12 | host_nibble(src, rows, cols, r1, c + 3) << 28;
  dst[o] = v;
}

// elem_bytes 2 or 4; src [rows, groups], dst [tiles][groups_p][16] (rows 0, 8, 1, 9, ...).
__global__ void tile_scales_kernel(const uint8_t* src, uint8_t* dst, int rows, int groups,
                                   int groups_p, int elem_bytes, int64_t count) {
  const int64_t o = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (o >= count) return;
  const int pos = static_cast<int>(o % 16);
  const int gi = static_cast<int>((o / 16) % groups_p);
  const int64_t tile = o / (16 * int64_t{groups_p});
  const int64_t r = tile * 16 + (pos % 2) * 8 + pos / 2;
  for (int k = 0; k < elem_bytes; ++k) {
    dst[o * elem_bytes + k] =
        r < rows && gi < groups ? src[(r * groups + gi) * elem_bytes + k] : uint8_t{0};
  }
}

int g_ksplit = 0, g_unroll = 0;

// Block: kWarps warps = (kWarps / ksplit) tiles x ksplit warps splitting the column blocks.
template <bool G32, int U>
__global__ void __launch_bounds__(512) gemv4_kernel(Params p) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x * (blockDim.x / 32 / p.ksplit) + warp / p.ksplit;
  const int ks = warp % p.ksplit;
  const int tile_c = min(tile, p.tiles - 1);  // surplus warps compute a copy, store nothing
  const uint8_t* wbase = p.qweight + (int64_t{tile_c} * p.kblocks * 32 + lane) * 16;
  const int64_t sbase = int64_t{tile_c} * p.groups_p * 16 + 2 * g;
  const __half* xrow = p.x + int64_t{min(g, p.n - 1)} * p.cols;  // B column g: token g
  const __half2 lo_base = __float2half2_rn(p.asym ? 1024.f : 1032.f);
  const __half2 hi_base = __float2half2_rn(p.asym ? -64.f : -72.f);
  const uint32_t ones[4] = {0x3C003C00u, 0x3C003C00u, 0x3C003C00u, 0x3C003C00u};

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  // Scale the partial sums of one group into acc: rows g, g+8 x tokens 2t, 2t+1.
  auto flush = [&](float (&cg)[4], float (&cx)[4], int gi) {
    const float2 s = load_tile_pair(p.scales, p.scale_f32, sbase + int64_t{gi} * 16);
    acc[0] += s.x * cg[0];
    acc[1] += s.x * cg[1];
    acc[2] += s.y * cg[2];
    acc[3] += s.y * cg[3];
    if (p.asym) {
      const float2 m = load_tile_pair(p.mins, p.scale_f32, sbase + int64_t{gi} * 16);
      acc[0] += m.x * cx[0];
      acc[1] += m.x * cx[1];
      acc[2] += m.y * cx[2];
      acc[3] += m.y * cx[3];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) cg[i] = cx[i] = 0.f;
  };

  for (int b0 = ks; b0 < p.kblocks; b0 += U * p.ksplit) {
    uint4 q[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int b = min(b0 + u * p.ksplit, p.kblocks - 1);
      q[u] = load_stream(wbase + int64_t{b} * 512);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int b = b0 + u * p.ksplit;
      if (b >= p.kblocks) break;
      // x for steps 0-1 (columns 64b + 8t ..) and 2-3 (64b + 32 + 8t ..).
      uint32_t xv[2][4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int c = 64 * b + 32 * h + 8 * t;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (c < p.cols) {
          if (p.perm == nullptr) {
            v = __ldg(reinterpret_cast<const uint4*>(xrow + c));
          } else {
            __half hx[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) hx[i] = xrow[__ldg(p.perm + c + i)];
            memcpy(&v, hx, 16);
          }
        }
        xv[h][0] = v.x;
        xv[h][1] = v.y;
        xv[h][2] = v.z;
        xv[h][3] = v.w;
      }
      const uint32_t words[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
      float cg[4] = {0.f, 0.f, 0.f, 0.f}, cx[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t a[4];
        int4_word_to_fragment(words[j], lo_base, hi_base, a);
        const uint32_t bx0 = xv[j / 2][2 * (j % 2)], bx1 = xv[j / 2][2 * (j % 2) + 1];
        mma_16816(cg, a, bx0, bx1);
        if (p.asym) mma_16816(cx, ones, bx0, bx1);
        if (G32 && j == 1) flush(cg, cx, 2 * b);
      }
      flush(cg, cx, G32 ? 2 * b + 1 : (64 * b) >> p.group_log2);
    }
  }

  __shared__ float4 partial[16][32];
  if (p.ksplit > 1) {
    partial[warp][lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    __syncthreads();
    if (ks != 0) return;
    for (int i = 1; i < p.ksplit; ++i) {
      const float4 v = partial[warp + i][lane];
      acc[0] += v.x;
      acc[1] += v.y;
      acc[2] += v.z;
      acc[3] += v.w;
    }
  }
  if (tile >= p.tiles) return;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = 16 * tile + g + 8 * (i / 2), tok = 2 * t + (i % 2);
    if (row < p.rows && tok < p.n) {
      float v = acc[i];
      if (p.bias != nullptr) v += __half2float(p.bias[row]);
      p.y[int64_t{tok} * p.rows + row] = __float2half_rn(v);
    }
  }
}

// One thread per 16-byte lane piece: rows g, g+8 x 16 columns, in float, original column order.
__global__ void dequant4_kernel(Params p, __half* out) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= int64_t{p.tiles} * p.kblocks * 32) return;
  const int lane = static_cast<int>(i % 32), b = static_cast<int>((i / 32) % p.kblocks);
  const int tile = static_cast<int>(i / 32 / p.kblocks), g = lane / 4, t = lane % 4;
  const uint4 q = load_stream(p.qweight + i * 16);
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
  const float off = p.asym ? 0.f : 8.f;
  for (int j = 0; j < 4; ++j) {
    const int c0 = 64 * b + 32 * (j / 2) + 8 * t + 4 * (j % 2);
    if (c0 >= p.cols) continue;
    const int gi = c0 >> p.group_log2;
    const int64_t sidx = (int64_t{tile} * p.groups_p + gi) * 16 + 2 * g;
    const float2 s = load_tile_pair(p.scales, p.scale_f32, sidx);
    const float2 m = p.asym ? load_tile_pair(p.mins, p.scale_f32, sidx) : make_float2(0.f, 0.f);
    for (int e = 0; e < 8; ++e) {
      // Bit positions as in the layout comment: e = 2 * (column pair) + upper row.
      const int hi_row = e % 2, pair = e / 2;  // pair 0: c, c+1; pair 1: c+2, c+3 (regs 0-3)
      const int reg = (pair / 2) * 2 + hi_row, col = c0 + 2 * (pair / 2) + pair % 2;
      const int shift = 4 * reg + 16 * (pair % 2);
      const int row = 16 * tile + g + 8 * hi_row;
      if (row >= p.rows) continue;
      const float qv = static_cast<float>((words[j] >> shift) & 0xF) - off;
      const float v = hi_row ? qv * s.y + m.y : qv * s.x + m.x;
      const int dst_col = p.perm == nullptr ? col : p.perm[col];
      out[int64_t{row} * p.cols + dst_col] = __float2half_rn(v);
    }
  }
}

}  // namespace

void tile_int4_upload(const uint8_t* host_q, const uint8_t* host_scales, const uint8_t* host_mins,
                      const Params& p, uint8_t* dst_q, uint8_t* dst_scales, uint8_t* dst_mins) {
  // Stage the host-layout bytes on the device, then permute there (fast for big weights).
  const int64_t qbytes = int64_t{p.rows} * p.cols / 2;
  const int esize = p.scale_f32 ? 4 : 2;
  const int64_t sbytes = int64_t{p.rows} * (p.cols / p.group) * esize;
  uint8_t* stage = nullptr;
  check_cuda(cudaMalloc(&stage, qbytes + 2 * sbytes + 16), "cudaMalloc (weight staging)");
  auto run = [&]() {
    check_cuda(cudaMemcpy(stage, host_q, qbytes, cudaMemcpyHostToDevice), "cudaMemcpy (weight)");
    const int64_t words = int64_t{p.tiles} * p.kblocks * 128;
    tile_weights_kernel<<<static_cast<unsigned>((words + 255) / 256), 256>>>(
        stage, reinterpret_cast<uint32_t*>(dst_q), p.rows, p.cols, p.kblocks, words);
    check_cuda(cudaGetLastError(), "tile_weights launch");
    const int64_t count = int64_t{p.tiles} * p.groups_p * 16;
    for (int k = 0; k < (p.asym ? 2 : 1); ++k) {
      uint8_t* s_stage = stage + qbytes + 16;
      check_cuda(cudaMemcpy(s_stage, k ? host_mins : host_scales, sbytes, cudaMemcpyHostToDevice),
                 "cudaMemcpy (scales)");
      tile_scales_kernel<<<static_cast<unsigned>((count + 255) / 256), 256>>>(
          s_stage, k ? dst_mins : dst_scales, p.rows, p.cols / p.group, p.groups_p, esize, count);
      check_cuda(cudaGetLastError(), "tile_scales launch");
      check_cuda(cudaDeviceSynchronize(), "weight tiling");
    }
  };
  try {
    run();
  } catch (...) {
    cudaFree(stage);
    throw;
  }
  cudaFree(stage);
}

void launch_gemv4(const Params& p, cudaStream_t stream) {
  Params q = p;
  int ks = g_ksplit;
  if (ks == 0) {
    // Aim at ~3000 warps (about 24 per SM) while keeping >= 4 column blocks per warp.
    ks = 1;
    while (ks < 16 && q.tiles * ks < 3000 && q.kblocks / (2 * ks) >= 4) ks *= 2;
  }
  q.ksplit = ks;
  const int warps = std::max(8, ks), tiles_per_block = warps / ks;
  const unsigned blocks = static_cast<unsigned>((q.tiles + tiles_per_block - 1) / tiles_per_block);
  const bool g32 = q.group == 32;
  const int unroll = g_unroll == 0 ? 4 : g_unroll;
  if (unroll == 8) {
    if (g32) gemv4_kernel<true, 8><<<blocks, warps * 32, 0, stream>>>(q);
    else gemv4_kernel<false, 8><<<blocks, warps * 32, 0, stream>>>(q);
  } else if (unroll == 2) {
    if (g32) gemv4_kernel<true, 2><<<blocks, warps * 32, 0, stream>>>(q);
    else gemv4_kernel<false, 2><<<blocks, warps * 32, 0, stream>>>(q);
  } else {
    if (g32) gemv4_kernel<true, 4><<<blocks, warps * 32, 0, stream>>>(q);
    else gemv4_kernel<false, 4><<<blocks, warps * 32, 0, stream>>>(q);
  }
}

void launch_dequant4(const Params& p, __half* out, cudaStream_t stream) {
  const int64_t pieces = int64_t{p.tiles} * p.kblocks * 32;
  dequant4_kernel<<<static_cast<unsigned>((pieces + 255) / 256), 256, 0, stream>>>(p, out);
}

void set_gemv_ksplit(int ksplit) { g_ksplit = ksplit; }
void set_gemv_unroll(int unroll) { g_unroll = unroll; }

}  // namespace gyre::qlinear_detail
