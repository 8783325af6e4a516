// 2/3/5/6-bit quantized weights on the GPU: the GEMV (decode, any n in chunks of 8 tokens) and
// the FP16 dequantization (prefill: dequantize + cuBLAS in the backend). The device layout is the
// host's split-plane layout (backend/cpu/qlinear_ref.h, "Narrow widths"), uploaded as it is.
//
// GEMV work split (as the 8-bit GEMV in qlinear.cu): a block of kWarps warps; each group of
// p.ksplit warps owns R (2 or 4) weight rows, and each warp of the group walks the rows'
// 1024-column tiles with a stride of the group. Lane u of a warp decodes unit u (32 columns = BITS
// u32 words) of the tile: word j of the 32 units is contiguous, so each of the BITS loads of a warp
// is one coalesced 128-byte read. Decoding a column pair is a shift and a mask of the low-plane
// word, the same of the high-plane word shifted into place, the 0x6400 magic number (half 1024 + q)
// and one subtraction, then one FMA with the group's scale and min. Products go through FP16 in
// runs of 16 before a float accumulator takes them, as the 8-bit GEMV does.
#include <algorithm>

#include "backend/cuda/qlinear_kernels.cuh"
#include "core/error.h"

namespace gyre::qlinear_detail {

namespace {

constexpr int kWarps = 4;
// Weight rows per warp group (each x load serves all of them). Measured on H100
// (bench/qlinear_notes.md, round 4): n = 1 is fastest with 2 (more warps in flight; 4096x14336
// 5-bit 27 us against 37 us), n = 8 with 4 (x reuse; 37 -> 23 us at 4096x4096 5-bit), so auto
// takes 4 from n = 4 on. set_bits_rows overrides it for benchmarks (0 = auto).
int g_rows = 0;
constexpr int kAutoFourRowsFromN = 4;

template <int BITS>
struct Planes {
  static constexpr int kLo = BITS >= 5 ? 4 : 2;  // low-plane bits
  static constexpr int kHi = BITS - kLo;         // high-plane bits (0, 1 or 2)
};

// Pair k (columns 2k, 2k+1) of a plane of P bits per value stored from words[first]: the two
// values in the low bits of the two 16-bit halves.
template <int P>
__device__ __forceinline__ uint32_t plane_pair(const uint32_t* words, int k) {
  constexpr int kPairsPerWord = 16 / P;
  constexpr uint32_t kMask = ((1u << P) - 1) * 0x00010001u;
  return (words[k / kPairsPerWord] >> (P * (k % kPairsPerWord))) & kMask;
}

// One unit (BITS words: low plane, then high plane) -> 16 half2 in column order.
template <int BITS>
__device__ __forceinline__ void dequant_unit(const uint32_t* words, __half2 s, __half2 m, bool asym,
                                             __half2* w) {
  constexpr int kLo = Planes<BITS>::kLo, kHi = Planes<BITS>::kHi;
  constexpr uint32_t kOffset = 1u << (BITS - 1);
  const uint32_t base_bits = asym ? 0x64006400u : (0x6400u + kOffset) * 0x00010001u;
  const __half2 base = as_half2(base_bits);
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    uint32_t v = plane_pair<kLo>(words, k) | 0x64006400u;
    if constexpr (kHi > 0) v |= plane_pair<kHi>(words + kLo, k) << kLo;
    w[k] = __hfma2(__hsub2(as_half2(v), base), s, m);  // m is zero when symmetric
  }
}

__device__ __forceinline__ uint32_t load_word(const uint32_t* p) {
  uint32_t v;
  asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

template <int BITS, int NT, int kRows>
__global__ void __launch_bounds__(kWarps * 32) gemv_bits_kernel(Params p) {
  cuda::pdl_begin();                        // launched with PDL (launch.h)
  constexpr int kUnroll = NT <= 2 ? 4 : 2;  // tiles in flight per warp
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row0 = (blockIdx.x * (kWarps / p.ksplit) + warp / p.ksplit) * kRows;
  const int units = p.cols / 32, tiles = (units + 31) / 32, groups = p.cols / p.group;
  const int64_t row_words = static_cast<int64_t>(units) * BITS;
  const auto* qw = reinterpret_cast<const uint32_t*>(p.qweight);

  float acc[NT][kRows];
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[t][r] = 0.0f;

  for (int tile0 = warp % p.ksplit; tile0 < tiles; tile0 += kUnroll * p.ksplit) {
    uint32_t q[kUnroll][kRows][BITS];
    // Issue every load of this step before the first use.
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int tile = min(tile0 + u * p.ksplit, tiles - 1);
      const int m = min(32, units - 32 * tile), lane_unit = min(lane, m - 1);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int row = min(row0 + r, p.rows - 1);
        const uint32_t* src = qw + row * row_words + static_cast<int64_t>(tile) * 32 * BITS;
#pragma unroll
        for (int j = 0; j < BITS; ++j) q[u][r][j] = load_word(src + j * m + lane_unit);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int tile = tile0 + u * p.ksplit;
      if (tile >= tiles) break;
      const int unit = tile * 32 + lane;
      if (unit >= units) continue;  // the short last tile
      const int c0 = unit * 32;
      __half2 w[kRows][16];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int row = min(row0 + r, p.rows - 1);
        __half2 s, mn;
        load_scale(p, static_cast<int64_t>(row) * groups + c0 / p.group, s, mn);
        dequant_unit<BITS>(q[u][r], s, mn, p.asym, w[r]);
      }
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        __half2 xv[16];
        load_x<32>(p, t, c0, xv);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            __half2 a = __hmul2(w[r][8 * h], xv[8 * h]);
#pragma unroll
            for (int j = 1; j < 8; ++j) a = __hfma2(w[r][8 * h + j], xv[8 * h + j], a);
            const float2 f = __half22float2(a);
            acc[t][r] += f.x + f.y;
          }
        }
      }
    }
  }

  __shared__ float partial[kWarps][NT * kRows];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float v = acc[t][r];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0) partial[warp][t * kRows + r] = v;
    }
  }
  __syncthreads();
  if (threadIdx.x < kWarps / p.ksplit * NT * kRows) {
    const int g = threadIdx.x / (NT * kRows), j = threadIdx.x % (NT * kRows);
    const int t = j / kRows, row = (blockIdx.x * (kWarps / p.ksplit) + g) * kRows + j % kRows;
    if (row < p.rows) {
      float v = 0.0f;
      for (int wi = 0; wi < p.ksplit; ++wi) v += partial[g * p.ksplit + wi][j];
      if (p.bias != nullptr) v += __half2float(p.bias[row]);
      store_out<true>(p, t, row, v);
    }
  }
}

template <int BITS, int NT, int kRows>
void launch_nt(Params p, cudaStream_t stream) {
  // Enough row groups to give every SM many warps: no split-K; fewer: split the tiles.
  const int row_groups = (p.rows + kRows - 1) / kRows;
  const int tiles = (p.cols / 32 + 31) / 32;
  p.ksplit = row_groups >= 2048 || tiles == 1 ? 1 : row_groups >= 1024 || tiles == 2 ? 2 : 4;
  const int per_block = kRows * (kWarps / p.ksplit);
  const int blocks = (p.rows + per_block - 1) / per_block;
  qlaunch(gemv_bits_kernel<BITS, NT, kRows>, blocks, kWarps * 32, 0, stream, p);
}

template <int BITS, int R>
void launch_rows(const Params& p, cudaStream_t stream) {
  switch (p.n) {
    case 1:
      return launch_nt<BITS, 1, R>(p, stream);
    case 2:
      return launch_nt<BITS, 2, R>(p, stream);
    case 3:
      return launch_nt<BITS, 3, R>(p, stream);
    case 4:
      return launch_nt<BITS, 4, R>(p, stream);
    case 5:
      return launch_nt<BITS, 5, R>(p, stream);
    case 6:
      return launch_nt<BITS, 6, R>(p, stream);
    case 7:
      return launch_nt<BITS, 7, R>(p, stream);
    default:
      return launch_nt<BITS, 8, R>(p, stream);
  }
}

template <int BITS>
void launch_bits(const Params& p, cudaStream_t stream) {
  if (g_rows == 4 || (g_rows == 0 && p.n >= kAutoFourRowsFromN))
    return launch_rows<BITS, 4>(p, stream);
  launch_rows<BITS, 2>(p, stream);
}

void launch_chunk(const Params& p, cudaStream_t stream) {
  switch (p.bits) {
    case 2:
      return launch_bits<2>(p, stream);
    case 3:
      return launch_bits<3>(p, stream);
    case 5:
      return launch_bits<5>(p, stream);
    case 6:
      return launch_bits<6>(p, stream);
    default:
      fail("qlinear: no narrow-width kernel for ", p.bits, " bits");
  }
}

// One thread per unit: dequantize 32 columns and store them in the original column order.
template <int BITS>
__global__ void dequant_bits_kernel(Params p, __half* out) {
  const int units = p.cols / 32;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(p.rows) * units) return;
  const int64_t row = i / units;
  const int unit = static_cast<int>(i % units), tile = unit / 32;
  const int m = min(32, units - 32 * tile);
  const uint32_t* src = reinterpret_cast<const uint32_t*>(p.qweight) + row * units * BITS +
                        static_cast<int64_t>(tile) * 32 * BITS + unit % 32;
  uint32_t words[BITS];
#pragma unroll
  for (int j = 0; j < BITS; ++j) words[j] = load_word(src + j * m);
  __half2 s, mn, w[16];
  load_scale(p, row * (p.cols / p.group) + unit * 32 / p.group, s, mn);
  dequant_unit<BITS>(words, s, mn, p.asym, w);
  __half* dst = out + row * p.cols;
  const int c0 = unit * 32;
  if (p.perm == nullptr) {
    uint4* d4 = reinterpret_cast<uint4*>(dst + c0);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint4 v;
      memcpy(&v, &w[4 * j], 16);
      d4[j] = v;
    }
  } else {
    for (int j = 0; j < 16; ++j) {
      dst[p.perm[c0 + 2 * j]] = __low2half(w[j]);
      dst[p.perm[c0 + 2 * j + 1]] = __high2half(w[j]);
    }
  }
}

}  // namespace

void launch_gemv_bits(const Params& p, cudaStream_t stream) {
  // Eight tokens per pass over the weight: larger n repeats the pass on the next tokens (the
  // backend dequantizes to FP16 for cuBLAS beyond n = 8 instead; this keeps every n correct).
  for (int t0 = 0; t0 < p.n; t0 += 8)
    launch_chunk(token_chunk(p, t0, std::min(8, p.n - t0)), stream);
}

void set_bits_rows(int rows) {
  GYRE_CHECK(rows == 0 || rows == 2 || rows == 4,
             "qlinear: narrow rows per warp must be 0, 2 or 4");
  g_rows = rows;
}

void launch_dequant_bits(const Params& p, __half* out, cudaStream_t stream) {
  const int64_t units = static_cast<int64_t>(p.rows) * (p.cols / 32);
  const int threads = 256;
  const auto blocks = static_cast<unsigned>((units + threads - 1) / threads);
  switch (p.bits) {
    case 2:
      return dequant_bits_kernel<2><<<blocks, threads, 0, stream>>>(p, out);
    case 3:
      return dequant_bits_kernel<3><<<blocks, threads, 0, stream>>>(p, out);
    case 5:
      return dequant_bits_kernel<5><<<blocks, threads, 0, stream>>>(p, out);
    case 6:
      return dequant_bits_kernel<6><<<blocks, threads, 0, stream>>>(p, out);
    default:
      fail("qlinear: no narrow-width dequantization for ", p.bits, " bits");
  }
}

}  // namespace gyre::qlinear_detail
