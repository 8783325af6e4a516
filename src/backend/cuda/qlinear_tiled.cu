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
  const int64_t byte = int64_t{r} * (cols / 2) + (c / 32) * 16 + ((c % 32) / 8) * 4 + (c % 2) * 2 +
                       ((c % 8) / 2) / 2;
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
  const uint32_t v =
      host_nibble(src, rows, cols, r0, c) | host_nibble(src, rows, cols, r0, c + 1) << 16 |
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

int g_ksplit = 0, g_unroll = 0, g_kernel = 0;

// Everything one lane needs for one 64-column block, fetched together so that a batch of
// blocks costs one memory round trip: the weight piece, x for its 16 columns (token g), and the
// raw scale (and min) pairs of its group(s) (f16 pair in .x, or two floats).
struct BlockData {
  uint4 q, x[2];
  uint2 s[2], m[2];
};

__device__ __forceinline__ uint2 load_pair_raw(const void* base, bool f32, int64_t idx) {
  if (f32) return __ldg(reinterpret_cast<const uint2*>(static_cast<const float*>(base) + idx));
  return make_uint2(
      __ldg(reinterpret_cast<const unsigned int*>(static_cast<const __half*>(base) + idx)), 0u);
}

__device__ __forceinline__ float2 pair_to_float2(uint2 v, bool f32) {
  return f32 ? make_float2(__uint_as_float(v.x), __uint_as_float(v.y))
             : __half22float2(as_half2(v.x));
}

// Block: warps = (warps / ksplit) tiles x ksplit warps splitting the column blocks. Each warp
// takes blocks ks, ks + ksplit, ... in batches of U fetched before any is used. (A
// double-buffered version needed ~100 registers and ran 1.3-1.5x slower: with at most ~30 warps
// per SM resident, fewer registers and more warps beat deeper per-warp pipelines here.)
template <bool G32, int U>
__global__ void __launch_bounds__(512) gemv4_kernel(Params p) {
  cuda::pdl_begin();  // launched with PDL (launch.h)
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

  // Loads are unconditional (block index clamped) so the compiler can issue a whole batch at once.
  auto fetch = [&](int b, BlockData& d) {
    b = min(b, p.kblocks - 1);
    d.q = load_stream(wbase + int64_t{b} * 512);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int c = 64 * b + 32 * h + 8 * t;
      d.x[h] = make_uint4(0, 0, 0, 0);
      if (c < p.cols) {
        if (p.perm == nullptr) {
          d.x[h] = __ldg(reinterpret_cast<const uint4*>(xrow + c));
        } else {
          __half hx[8];
#pragma unroll
          for (int i = 0; i < 8; ++i) hx[i] = xrow[__ldg(p.perm + c + i)];
          memcpy(&d.x[h], hx, 16);
        }
      }
    }
    const int gi = G32 ? 2 * b : (64 * b) >> p.group_log2;
#pragma unroll
    for (int k = 0; k < (G32 ? 2 : 1); ++k) {
      d.s[k] = load_pair_raw(p.scales, p.scale_f32, sbase + int64_t{gi + k} * 16);
      if (p.asym) d.m[k] = load_pair_raw(p.mins, p.scale_f32, sbase + int64_t{gi + k} * 16);
    }
  };

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  // Rows g, g+8 x tokens 2t, 2t+1: acc += s * sum(q x) (+ m * sum(x)) for one group.
  auto flush = [&](float(&cg)[4], float(&cx)[4], uint2 sr, uint2 mr) {
    const float2 m = p.asym ? pair_to_float2(mr, p.scale_f32) : make_float2(0.f, 0.f);
    flush_group(acc, cg, cx, pair_to_float2(sr, p.scale_f32), m, p.asym);
  };
  auto compute = [&](const BlockData& d) {
    const uint32_t words[4] = {d.q.x, d.q.y, d.q.z, d.q.w};
    const uint32_t xs[8] = {d.x[0].x, d.x[0].y, d.x[0].z, d.x[0].w,
                            d.x[1].x, d.x[1].y, d.x[1].z, d.x[1].w};
    float cg[4] = {0.f, 0.f, 0.f, 0.f}, cx[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t a[4];
      int4_word_to_fragment(words[j], lo_base, hi_base, a);
      mma_16816(cg, a, xs[2 * j], xs[2 * j + 1]);
      if (p.asym) mma_16816(cx, ones, xs[2 * j], xs[2 * j + 1]);
      if (G32 && j == 1) flush(cg, cx, d.s[0], d.m[0]);
    }
    flush(cg, cx, d.s[G32 ? 1 : 0], d.m[G32 ? 1 : 0]);
  };

  const int step = U * p.ksplit;
  for (int b0 = ks; b0 < p.kblocks; b0 += step) {
    BlockData cur[U];
#pragma unroll
    for (int u = 0; u < U; ++u) fetch(b0 + u * p.ksplit, cur[u]);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (b0 + u * p.ksplit < p.kblocks) compute(cur[u]);
    }
  }

  __shared__ float4 partial[16][32];
  reduce_store_gemv_tile(p, partial, warp, ks, tile, acc);
}

// One thread per 16-byte lane piece: rows g, g+8 x 16 columns, in float, original column order.
// Words 2h and 2h+1 hold columns 64b + 32h + 8t .. +7 of both rows: one 16-byte store per row
// and half block (the four t lanes of a row write 64 contiguous bytes).
__global__ void dequant4_kernel(Params p, __half* out) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= int64_t{p.tiles} * p.kblocks * 32) return;
  const int lane = static_cast<int>(i % 32), b = static_cast<int>((i / 32) % p.kblocks);
  const int tile = static_cast<int>(i / 32 / p.kblocks), g = lane / 4, t = lane % 4;
  const uint4 q = load_stream(p.qweight + i * 16);
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
  const float off = p.asym ? 0.f : 8.f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int c0 = 64 * b + 32 * h + 8 * t;
    if (c0 >= p.cols) continue;
    const int64_t sidx = (int64_t{tile} * p.groups_p + (c0 >> p.group_log2)) * 16 + 2 * g;
    const float2 s = load_tile_pair(p.scales, p.scale_f32, sidx);
    const float2 m = p.asym ? load_tile_pair(p.mins, p.scale_f32, sidx) : make_float2(0.f, 0.f);
#pragma unroll
    for (int hi_row = 0; hi_row < 2; ++hi_row) {
      const int row = 16 * tile + g + 8 * hi_row;
      if (row >= p.rows) continue;
      const float sc = hi_row ? s.y : s.x, mn = hi_row ? m.y : m.x;
      __half v[8];
#pragma unroll
      for (int d = 0; d < 8; ++d) {
        // Column c0 + d: word 2h + d / 4, register 2 ((d % 4) / 2) + hi_row, half d % 2.
        const int shift = 4 * (2 * ((d % 4) / 2) + hi_row) + 16 * (d % 2);
        const float qv = static_cast<float>((words[2 * h + d / 4] >> shift) & 0xF) - off;
        v[d] = __float2half_rn(qv * sc + mn);
      }
      __half* dst = out + int64_t{row} * p.cols;
      if (p.perm == nullptr) {
        uint4 packed;
        memcpy(&packed, v, 16);
        *reinterpret_cast<uint4*>(dst + c0) = packed;  // c0 % 8 == 0: 16-byte aligned
      } else {
#pragma unroll
        for (int d = 0; d < 8; ++d) dst[p.perm[c0 + d]] = v[d];
      }
    }
  }
}

}  // namespace

void tile_scales_upload(const uint8_t* host_scales, const uint8_t* host_mins, const Params& p,
                        uint8_t* dst_scales, uint8_t* dst_mins) {
  const int esize = p.scale_f32 ? 4 : 2;
  const int64_t sbytes = int64_t{p.rows} * (p.cols / p.group) * esize;
  DeviceStage stage(static_cast<size_t>(sbytes) + 16);
  const int64_t count = int64_t{p.tiles} * p.groups_p * 16;
  for (int k = 0; k < (p.asym ? 2 : 1); ++k) {
    check_cuda(cudaMemcpy(stage.p, k ? host_mins : host_scales, sbytes, cudaMemcpyHostToDevice),
               "cudaMemcpy (scales)");
    tile_scales_kernel<<<static_cast<unsigned>((count + 255) / 256), 256>>>(
        stage.p, k ? dst_mins : dst_scales, p.rows, p.cols / p.group, p.groups_p, esize, count);
    check_cuda(cudaGetLastError(), "tile_scales launch");
    check_cuda(cudaDeviceSynchronize(), "scale tiling");
  }
}

void tile_int4_upload(const uint8_t* host_q, const uint8_t* host_scales, const uint8_t* host_mins,
                      const Params& p, uint8_t* dst_q, uint8_t* dst_scales, uint8_t* dst_mins) {
  // Stage the host-layout bytes on the device, then permute there (fast for big weights).
  const int64_t qbytes = int64_t{p.rows} * p.cols / 2;
  {
    DeviceStage stage(static_cast<size_t>(qbytes) + 16);
    check_cuda(cudaMemcpy(stage.p, host_q, qbytes, cudaMemcpyHostToDevice), "cudaMemcpy (weight)");
    const int64_t words = int64_t{p.tiles} * p.kblocks * 128;
    tile_weights_kernel<<<static_cast<unsigned>((words + 255) / 256), 256>>>(
        stage.p, reinterpret_cast<uint32_t*>(dst_q), p.rows, p.cols, p.kblocks, words);
    check_cuda(cudaGetLastError(), "tile_weights launch");
    check_cuda(cudaDeviceSynchronize(), "weight tiling");
  }
  tile_scales_upload(host_scales, host_mins, p, dst_scales, dst_mins);
}

// qlinear_gemv_stream.cu
bool gemv4_stream_supported(const Params& p);
void launch_gemv4_stream(const Params& p, int ksplit, cudaStream_t stream);

// The 4-bit decode GEMV dispatch (set_gemv_kernel: 0 auto, 1 register-fed, 4 stream).
void launch_gemv4(const Params& p, cudaStream_t stream) {
  // The stream kernel (qlinear_gemv_stream.cu) by default at n <= 2, where it measured faster
  // on every Llama shape on H100 (bench/qlinear_notes.md, round 5); the register-fed kernel
  // below for n = 3..8 (the stream kernel's x staging grows with n).
  const bool stream_default = g_kernel == 0 && p.n <= 2;
  if ((g_kernel == 4 || stream_default || p.norm_w != nullptr || p.had_block > 0 || p.x_cols > 0) &&
      gemv4_stream_supported(p))
    return launch_gemv4_stream(p, g_ksplit, stream);
  Params q = p;
  int ks = g_ksplit;
  if (ks == 0) {
    // Aim at ~7000 warps (measured best on H100 for 14336 / 28672 rows: ksplit 8 / 4) while
    // keeping >= 4 column blocks per warp. ksplit 16 (one 16-warp block per tile, two blocks
    // per SM at 64 registers) only while the tiles fit one wave: 384 tiles (fused QKV,
    // 6144x4096) ran 8-9% faster at ksplit 8 than at 16 (round 4).
    static int sms = 0;
    if (sms == 0) {
      int dev = 0;
      check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
      check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev),
                 "cudaDeviceGetAttribute");
    }
    ks = 1;
    while (ks < 16 && q.tiles * ks < 7000 && q.kblocks / (2 * ks) >= 4 &&
           (ks < 8 || q.tiles <= 2 * sms))
      ks *= 2;
  }
  q.ksplit = ks;
  const int warps = std::max(8, ks), tiles_per_block = warps / ks;
  const unsigned blocks = static_cast<unsigned>((q.tiles + tiles_per_block - 1) / tiles_per_block);
  // Bench knob: 16-byte loads in flight per lane (2 or 4). 2 keeps the kernel at 64 registers.
  const int unroll = g_unroll == 0 ? 2 : g_unroll;
  const unsigned threads = warps * 32;
  const bool g32 = q.group == 32;
  auto go = [&](auto kernel_g32, auto kernel) {
    qlaunch(g32 ? kernel_g32 : kernel, blocks, threads, 0, stream, q);
  };
  if (unroll == 4) return go(gemv4_kernel<true, 4>, gemv4_kernel<false, 4>);
  return go(gemv4_kernel<true, 2>, gemv4_kernel<false, 2>);
}

void launch_dequant4(const Params& p, __half* out, cudaStream_t stream) {
  const int64_t pieces = int64_t{p.tiles} * p.kblocks * 32;
  dequant4_kernel<<<static_cast<unsigned>((pieces + 255) / 256), 256, 0, stream>>>(p, out);
}

void set_gemv_ksplit(int ksplit) {
  g_ksplit = ksplit;
}
void set_gemv_unroll(int unroll) {
  g_unroll = unroll;
}
void set_gemv_kernel(int kernel) {
  g_kernel = kernel;
}

}  // namespace gyre::qlinear_detail
