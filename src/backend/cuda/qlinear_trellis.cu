// Trellis-coded weights (backend/cpu/trellis.h) on the GPU: the device layout, its upload, the
// decode GEMV (n = 1..8, the stream kernel of qlinear_stream.cuh re-fitted to trellis tiles) and
// the dequantization to FP16 that prefill and larger batches feed to cuBLAS.
//
// Device layout. Rows in 16-row tile rows, columns in pieces of 4 tiles (64 columns; pieces =
// ceil(cols / 64), the tail piece padded with zero words). Lane l of a warp decodes positions
// 8l..8l+7 of a tile, which are exactly its m16n8k16 A-fragment registers, from the tile's stream
// bits [8Kl, 8Kl + 8K) plus the first 16 - K bits of lane l + 1's (circularly: tail-biting). The
// upload gathers lane l's 8K bits of the piece's 4 tiles into one K-word lane vector (tile s at
// bit 8Ks), so one coalesced load per unit brings a lane all of its bits of the piece and K or
// fewer shuffles bring the neighbour's. The vector's K words are stored in units of U words (U =
// 4, 2 or 1, the widest dividing K), unit-major across the warp: (unit u, lane l) at piece base +
// (32u + l) U words, so every load instruction reads 32 U contiguous words.
// Scales: [tile rows][groups_p][16] f16, rows ordered 0, 8, 1, 9, ... (lane g reads rows g, g + 8
// in one u32), groups_p = ceil(pieces * 64 / group), padding zero.
//
// Decode per weight: the 16-bit state (a shift and mask; at K = 4 mostly one byte permute), IMAD
// (s * kTrellisMul + kTrellisAdd), IDP4A with the addend 0x6400 + 512 (the f16 bits of 1536 +
// code: codes lie in [-512, 511]), and per pair one byte permute into the A register, which thus
// holds 1536 + code. A second MMA of x with ones gives the sums that take the 1536 out at each
// group's end, where the group scale multiplies the float accumulator (as in the 4-bit stream
// kernel). Measured on H100: ALU-bound, ~2.5e12 weights/s (bench/qlinear_notes.md, session 8).
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/trellis.h"
#include "backend/cpu/trellis_layout.h"
#include "backend/cuda/qlinear_stream_launch.cuh"
#include "backend/cuda/qlinear_trellis.cuh"
#include "core/error.h"

namespace gyre::qlinear_detail {

namespace {

int pieces_of(const QWeightDesc& d) {
  return (d.cols + kPieceCols - 1) / kPieceCols;
}
int groups_p_of(const QWeightDesc& d) {
  return (pieces_of(d) * kPieceCols + d.group_size - 1) / d.group_size;
}

// n bits (<= 32) of a word array at bit offset off, lowest first.
uint32_t get_bits(const uint32_t* w, int off, int n) {
  uint64_t win = w[off >> 5];
  if ((off & 31) + n > 32) win |= uint64_t{w[(off >> 5) + 1]} << 32;
  win >>= (off & 31);
  return n == 32 ? uint32_t(win) : uint32_t(win) & ((1u << n) - 1);
}
void put_bits(uint32_t* w, int off, int n, uint32_t v) {
  for (int i = 0; i < n; ++i)
    if ((v >> i) & 1u) w[(off + i) >> 5] |= 1u << ((off + i) & 31);
}

// x rows 0..n-1 into shared memory, each piece's 64 columns reordered so that lane t's B
// fragments of the piece's 4 tiles are 8 consecutive words: word 8t + 2s + h holds columns
// 16s + 8h + 2t, +1 (zeros past cols).
__device__ __forceinline__ void stage_trellis_x(const Params& p, uint32_t* xs, int stride_words) {
  const int chunks = p.kblocks * kPieceCols / 8;
  for (int tok = 0; tok < p.n; ++tok) {
    const __half* row = p.x + int64_t{tok} * p.cols;
    for (int i = threadIdx.x; i < chunks; i += blockDim.x) {
      const int c = i * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (c < p.cols) v = __ldg(reinterpret_cast<const uint4*>(row + c));  // cols % 16 == 0
      const int b = c / kPieceCols, o = c % kPieceCols, s = o / 16, h = (o % 16) / 8;
      uint32_t* dst = xs + tok * stride_words + b * 32 + 2 * s + h;
      dst[0] = v.x;
      dst[8] = v.y;
      dst[16] = v.z;
      dst[24] = v.w;
    }
  }
  __syncthreads();
}

// WHOLE: groups are whole pieces (group % 64 == 0), one scale per piece.
template <int K, bool WHOLE>
struct TrellisSlot {
  uint32_t q[K];
  uint32_t s[WHOLE ? 1 : kPieceTiles];  // scales of rows g, g + 8 for each tile's group
};

// gemv_stream_kernel's structure (qlinear_stream.cuh): warps split the pieces of one 16-row tile
// row (split-K), D pieces in flight per warp, x in shared memory.
template <int K, int D, bool WHOLE>
__global__ void __launch_bounds__(512)
    trellis_gemv_kernel(Params p, int per, int group_tiles, uint32_t group_magic) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint32_t* xs = reinterpret_cast<uint32_t*>(smem_raw);
  constexpr int kPieceWords = 32 * K;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x * (blockDim.x / 32 / p.ksplit) + warp / p.ksplit;
  const int ks = warp % p.ksplit;
  const int tile_c = min(tile, p.tiles - 1);  // surplus warps compute a copy, store nothing
  const int pieces = p.kblocks;
  const int i_begin = min(ks * per, pieces), i_end = min(i_begin + per, pieces);
  const int np = i_end - i_begin;
  const uint32_t* wbase =
      reinterpret_cast<const uint32_t*>(p.qweight) + int64_t{tile_c} * pieces * kPieceWords;
  const unsigned int* sbase = reinterpret_cast<const unsigned int*>(
      static_cast<const __half*>(p.scales) + int64_t{tile_c} * p.groups_p * 16 + 2 * g);

  auto fetch = [&](int i, TrellisSlot<K, WHOLE>& d) {
    load_piece<K>(wbase + int64_t{i} * kPieceWords, lane, d.q);
    if constexpr (WHOLE) {
      d.s[0] = __ldg(sbase + __umulhi(static_cast<uint32_t>(kPieceTiles * i), group_magic) * 8);
    } else {
#pragma unroll
      for (int s = 0; s < kPieceTiles; ++s) {
        const uint32_t tc = static_cast<uint32_t>(kPieceTiles * i + s);
        d.s[s] = __ldg(sbase + (group_tiles == 1 ? tc : __umulhi(tc, group_magic)) * 8);
      }
    }
  };
  TrellisSlot<K, WHOLE> ring[D];
#pragma unroll
  for (int u = 0; u < D; ++u)
    if (u < np) fetch(i_begin + u, ring[u]);

  // PDL (launch.h): the weight loads above overlap the previous kernel's tail.
  cuda::pdl_begin();
  const int stride_words = (p.kblocks * kPieceCols + kStreamXPad) / 2;
  stage_trellis_x(p, xs, stride_words);
  const uint32_t* xrow = xs + min(g, p.n - 1) * stride_words + 8 * t;  // B column g: token g

  float acc[4] = {0.f, 0.f, 0.f, 0.f}, cg[4] = {0.f, 0.f, 0.f, 0.f}, cx[4] = {0.f, 0.f, 0.f, 0.f};
  // Tiles (WHOLE: pieces) left in the current group (groups start at multiples of group_tiles).
  const int group_units = WHOLE ? group_tiles / kPieceTiles : group_tiles;
  int left = group_units - (WHOLE ? i_begin : kPieceTiles * i_begin) % group_units;
  const uint32_t kOnes[4] = {0x3C003C00u, 0x3C003C00u, 0x3C003C00u, 0x3C003C00u};
  // acc += scale * (sum (1536 + code) x - 1536 sum x) for rows g / g + 8 (scale.x / scale.y).
  auto flush = [&](uint32_t scale_pair) {
    const float2 sc = __half22float2(as_half2(scale_pair));
    flush_group(acc, cg, cx, sc, make_float2(-1536.f * sc.x, -1536.f * sc.y), true);
  };
  auto compute = [&](const TrellisSlot<K, WHOLE>& d, int i) {
    uint32_t nb[K];
    neighbour_words<K>(d.q, nb);
    const uint4 x0 = *reinterpret_cast<const uint4*>(xrow + 32 * i);
    const uint4 x1 = *reinterpret_cast<const uint4*>(xrow + 32 * i + 4);
    const uint32_t xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
    for (int s = 0; s < kPieceTiles; ++s) {
      uint32_t a[4];
      tile_fragment<K>(d.q, nb, s, a);
      mma_16816(cg, a, xv[2 * s], xv[2 * s + 1]);
      mma_16816(cx, kOnes, xv[2 * s], xv[2 * s + 1]);
      if (!WHOLE && --left == 0) {
        flush(d.s[WHOLE ? 0 : s]);
        left = group_units;
      }
    }
    if (WHOLE && --left == 0) {
      flush(d.s[0]);
      left = group_units;
    }
  };
  uint32_t last_scale = 0;
  for (int i0 = 0; i0 < np; i0 += D) {
#pragma unroll
    for (int u = 0; u < D; ++u) {
      const int i = i0 + u;
      if (i < np) {
        compute(ring[u], i_begin + i);
        last_scale = ring[u].s[WHOLE ? 0 : kPieceTiles - 1];
        if (i + D < np) fetch(i_begin + i + D, ring[u]);
      }
    }
  }
  // A split range may end inside a group: its partial sums take the group's scale here.
  if (left != group_units) flush(last_scale);

  __shared__ float4 partial[16][32];
  reduce_store_gemv_tile(p, partial, warp, ks, tile, acc);
}

template <int K, int D, bool WHOLE>
void launch_trellis_kernel(const Params& p, cudaStream_t stream) {
  int sms = 0, optin = 0;
  stream_device_limits(sms, optin);
  Params q = p;
  const int pieces = q.kblocks;
  int ks = 1;
  // As the stream kernel: the largest split-K keeping tiles x ksplit within 32 warps per SM.
  while (ks < 16 && q.tiles * ks * 2 <= sms * 32 && pieces >= 2 * ks) ks *= 2;
  q.ksplit = ks;
  const int per = (pieces + ks - 1) / ks;
  const int warps = ks > 8 ? ks : 8, tiles_per_block = warps / ks;
  const unsigned blocks = static_cast<unsigned>((q.tiles + tiles_per_block - 1) / tiles_per_block);
  const int group_tiles = q.group / kTrellisTileDim;
  // floor(tile / group_tiles) = umulhi(tile, ceil(2^32 / group_tiles)) for tile < 2^16.
  // (group_tiles = 1: the tile itself; the kernel does not use the magic then.)
  const uint32_t magic =
      group_tiles == 1 ? 0u : static_cast<uint32_t>((uint64_t{1} << 32) / group_tiles + 1);
  auto kernel = trellis_gemv_kernel<K, D, WHOLE>;
  static const bool raised = allow_optin_shared(kernel, optin, "trellis gemv");
  (void)raised;
  const size_t smem = static_cast<size_t>(q.n) * (q.kblocks * kPieceCols + kStreamXPad) * 2;
  qlaunch(kernel, blocks, warps * 32, smem, stream, q, per, group_tiles, magic);
}

// One thread per (tile, lane): its 8 values, scale * code rounded to f16, into out [rows, cols].
template <int K>
__global__ void trellis_dequant_kernel(Params p, __half* out) {
  const int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int tiles_c = p.cols / kTrellisTileDim;
  if (idx >= int64_t{p.tiles} * tiles_c * 32) return;
  const int lane = static_cast<int>(idx % 32);
  const int64_t tile = idx / 32;
  const int tr = static_cast<int>(tile / tiles_c), tc = static_cast<int>(tile % tiles_c);
  const int piece = tc / kPieceTiles, s = tc % kPieceTiles;
  constexpr int U = trellis_unit(K);
  const uint32_t* base =
      reinterpret_cast<const uint32_t*>(p.qweight) + (int64_t{tr} * p.kblocks + piece) * 32 * K;
  uint32_t v[K], nb[K];
#pragma unroll
  for (int w = 0; w < K; ++w) {
    v[w] = __ldg(base + (32 * (w / U) + lane) * U + w % U);
    nb[w] = __ldg(base + (32 * (w / U) + ((lane + 1) & 31)) * U + w % U);
  }
  const int g = lane >> 2, t = lane & 3;
  const int gi = tc * kTrellisTileDim / p.group;
  const __half* sc = static_cast<const __half*>(p.scales) + (int64_t{tr} * p.groups_p + gi) * 16;
  const float s_lo = __half2float(sc[2 * g]), s_hi = __half2float(sc[2 * g + 1]);
  float codes[8];
  // s is a runtime value here: pick the tile's branch so that every index stays constant.
#pragma unroll
  for (int ss = 0; ss < kPieceTiles; ++ss) {
    if (ss != s) continue;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t h = code_1536(piece_state<K>(v, nb, ss, j)) & 0xFFFFu;
      codes[j] = static_cast<float>(static_cast<int>(h) - 0x6400 - 512);
    }
  }
  const int64_t r0 = int64_t{tr} * kTrellisTileDim + g;
  const int c0 = tc * kTrellisTileDim + 2 * t;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int64_t row = r0 + ((r & 1) ? 8 : 0);
    const int col = c0 + ((r & 2) ? 8 : 0);
    const float sr = (r & 1) ? s_hi : s_lo;
    *reinterpret_cast<__half2*>(out + row * p.cols + col) =
        __floats2half2_rn(sr * codes[2 * r], sr * codes[2 * r + 1]);
  }
}

template <template <int> class F, class... A>
void by_bits(int k, A&&... a) {
  switch (k) {
    case 2:
      return F<2>::run(a...);
    case 3:
      return F<3>::run(a...);
    case 4:
      return F<4>::run(a...);
    case 5:
      return F<5>::run(a...);
    case 6:
      return F<6>::run(a...);
    default:
      return F<8>::run(a...);
  }
}

int g_depth = 0;  // set_trellis_depth

template <int K, bool WHOLE>
void launch_depth(const Params& p, int depth, cudaStream_t stream) {
  if (depth == 2) return launch_trellis_kernel<K, 2, WHOLE>(p, stream);
  if (depth == 4) return launch_trellis_kernel<K, 4, WHOLE>(p, stream);
  launch_trellis_kernel<K, 8, WHOLE>(p, stream);
}

template <int K>
struct GemvByBits {
  static void run(const Params& p, cudaStream_t stream) {
    // Measured on H100 (bench/qlinear_notes.md, session 8): depth 2 at n <= 2 (more resident
    // warps: fewer registers), 4 beyond.
    const int depth = g_depth != 0 ? g_depth : p.n <= 2 ? 2 : 4;
    if (p.group % kPieceCols == 0) return launch_depth<K, true>(p, depth, stream);
    launch_depth<K, false>(p, depth, stream);
  }
};
template <int K>
struct DequantByBits {
  static void run(const Params& p, __half* out, cudaStream_t stream) {
    const int64_t threads = int64_t{p.tiles} * (p.cols / kTrellisTileDim) * 32;
    trellis_dequant_kernel<K>
        <<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(p, out);
  }
};

}  // namespace

void trellis_device_sizes(const QWeightDesc& d, size_t& qbytes, size_t& scale_bytes) {
  const size_t tiles = static_cast<size_t>(d.rows / kTrellisTileDim);
  qbytes = tiles * pieces_of(d) * 128 * d.bits;
  scale_bytes = tiles * groups_p_of(d) * 16 * 2;
}

void trellis_layout_params(const QWeightDesc& d, Params& p) {
  p.tiles = d.rows / kTrellisTileDim;
  p.kblocks = pieces_of(d);
  p.groups_p = groups_p_of(d);
}

void trellis_upload(const QWeightHost& w, uint8_t* dst_q, uint8_t* dst_scales) {
  const QWeightDesc& d = w.desc;
  trellis_validate(d);
  const int k = d.bits, unit = trellis_unit(k), pieces = pieces_of(d), groups_p = groups_p_of(d);
  const int tiles_r = d.rows / kTrellisTileDim, tiles_c = d.cols / kTrellisTileDim;
  const int groups = d.cols / d.group_size;
  std::vector<uint32_t> q(static_cast<size_t>(tiles_r) * pieces * 32 * k, 0u);
  std::vector<uint32_t> lanevec(k);
  for (int tr = 0; tr < tiles_r; ++tr) {
    for (int pc = 0; pc < pieces; ++pc) {
      uint32_t* piece = q.data() + (static_cast<size_t>(tr) * pieces + pc) * 32 * k;
      for (int lane = 0; lane < 32; ++lane) {
        std::fill(lanevec.begin(), lanevec.end(), 0u);
        for (int s = 0; s < kPieceTiles; ++s) {
          const int tc = pc * kPieceTiles + s;
          if (tc >= tiles_c) break;  // padding stays zero (x is zero there)
          const uint32_t* words = trellis_tile(w, tr, tc);
          for (int b = 0; b < 8 * k; b += 32) {
            const int n = std::min(32, 8 * k - b);
            put_bits(lanevec.data(), 8 * k * s + b, n, get_bits(words, 8 * k * lane + b, n));
          }
        }
        for (int wi = 0; wi < k; ++wi)
          piece[(32 * (wi / unit) + lane) * unit + wi % unit] = lanevec[wi];
      }
    }
  }
  std::vector<uint16_t> sc(static_cast<size_t>(tiles_r) * groups_p * 16, 0);
  for (int tr = 0; tr < tiles_r; ++tr)
    for (int gi = 0; gi < groups; ++gi)
      for (int rr = 0; rr < 16; ++rr) {
        const int64_t row = int64_t{tr} * 16 + rr;
        const int slot = rr < 8 ? 2 * rr : 2 * (rr - 8) + 1;  // rows 0, 8, 1, 9, ...
        std::memcpy(&sc[(static_cast<size_t>(tr) * groups_p + gi) * 16 + slot],
                    w.scales.data() + (row * groups + gi) * 2, 2);
      }
  check_cuda(cudaMemcpy(dst_q, q.data(), q.size() * 4, cudaMemcpyHostToDevice),
             "cudaMemcpy (trellis weight)");
  check_cuda(cudaMemcpy(dst_scales, sc.data(), sc.size() * 2, cudaMemcpyHostToDevice),
             "cudaMemcpy (trellis scales)");
}

void launch_gemv_trellis(const Params& p, cudaStream_t stream) {
  GYRE_CHECK(p.n >= 1, "trellis GEMV: batch of ", p.n, " rows");
  // Tokens per pass: up to 8 (one n8 MMA tile), fewer where their x would not fit shared memory
  // next to the 8 KB reduction space (8 tokens of 14336 columns do not).
  int sms = 0, optin = 0;
  stream_device_limits(sms, optin);
  const int per_token = (p.kblocks * kPieceCols + kStreamXPad) * 2;
  const int chunk = std::min(8, (optin - 8192 - 256) / per_token);
  GYRE_CHECK(chunk >= 1, "trellis GEMV: ", p.cols, " columns do not fit shared memory");
  for (int t0 = 0; t0 < p.n; t0 += chunk)
    by_bits<GemvByBits>(p.bits, token_chunk(p, t0, std::min(chunk, p.n - t0)), stream);
}

void launch_dequant_trellis(const Params& p, __half* out, cudaStream_t stream) {
  by_bits<DequantByBits>(p.bits, p, out, stream);
}

void set_trellis_depth(int depth) {
  GYRE_CHECK(depth == 0 || depth == 2 || depth == 4 || depth == 8,
             "trellis GEMV depth must be 0, 2, 4 or 8");
  g_depth = depth;
}

}  // namespace gyre::qlinear_detail
