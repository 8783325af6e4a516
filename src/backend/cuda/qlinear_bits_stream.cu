// 2/3/5/6-bit weights in the tiled split-plane layout (qlinear_stream.cuh describes it), and 8-bit
// ones in the same layout with one plane of bytes: the repack from the host layout at upload, the
// decode GEMV (the stream kernel on tensor cores, any n in chunks whose x fits shared memory) and
// the FP16 dequantization (prefill).
//
// Why a second device layout: the host layout (qlinear_bits.cu reads it as it is) keeps a row's
// units contiguous, which suits CUDA-core dot products but not the m16n8k16 fragments, and
// that kernel stayed at 25-45% of copy bandwidth (bench/qlinear_notes.md, round 4). In 16-row
// tiles a block of 64 columns is one contiguous 128 * bits-byte piece, read with one or two
// vector loads per lane and decoded straight into A fragments, so the narrow widths stream like
// the 4-bit kernel. GYRE_CUDA_BITS_STREAM=0 keeps the host layout and the old kernel (A/B);
// GYRE_CUDA_BITS_DECODE=old keeps the split planes' bit arrangement at 2/3/5/6 bits instead of
// the in-place one (qlinear_inplace.h: fewer decode instructions).
// 8 bits (session 27): the host layout's CUDA-core GEMV (qlinear_gemv8.cu) decoded the Llama-3-8B
// shape at 66% of its roofline, the 6-bit stream kernel at 78%; in this layout a byte pair
// becomes an A register by one PRMT. On by default since session 30 (H100: 8-bit decode 262 ->
// 311 tok/s, 66% -> 78% of the roofline; bench/NOTES.md); GYRE_CUDA_BITS8_STREAM=0 keeps the
// host layout and its kernels (A/B).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/qlinear.h"
#include "backend/cuda/qlinear_stream_launch.cuh"
#include "core/error.h"

namespace gyre::qlinear_detail {

void tile_scales_upload(const uint8_t* host_scales, const uint8_t* host_mins, const Params& p,
                        uint8_t* dst_scales, uint8_t* dst_mins);  // qlinear_tiled.cu

namespace {

int g_stream = -1;      // -1: GYRE_CUDA_BITS_STREAM (default on)
int g_pieces = 0;       // blocks per piece of new uploads: 0 = by width
int g_warp_budget = 0;  // 0 = by width and n
int g_chunk = 0;        // tokens per pass: 0 = by shape
int g_decode = -1;      // -1: GYRE_CUDA_BITS_DECODE (default new: the in-place arrangement)
int g_depth = 0;        // ring depth of the in-place 3-bit kernel at 2 blocks per piece: 0 = 2
int g_stream8 = -1;     // -1: GYRE_CUDA_BITS8_STREAM (default on: see above)

bool bits8_stream_enabled() {
  if (g_stream8 < 0) {
    const char* e = std::getenv("GYRE_CUDA_BITS8_STREAM");
    g_stream8 = e != nullptr && std::string(e) == "0" ? 0 : 1;
  }
  return g_stream8 == 1;
}

bool bits_decode_new() {
  if (g_decode < 0) {
    const char* e = std::getenv("GYRE_CUDA_BITS_DECODE");
    g_decode = e != nullptr && std::string(e) == "old" ? 0 : 1;
  }
  return g_decode == 1;
}

// Low-plane bits of a width (the host split planes, qlinear_ref.h; 8 bits: one plane).
__host__ __device__ constexpr int low_bits(int bits) {
  return bits == 8 ? 8 : bits >= 5 ? 4 : 2;
}

// The P-bit plane part of packed column c of row r in the host layout; 0 for padding. 8 bits:
// the byte (the host layout's bytes in column order).
__host__ __device__ uint32_t host_plane_value(const uint32_t* src, int rows, int cols, int bits,
                                              bool high, int r, int c) {
  if (r >= rows || c >= cols) return 0;
  if (bits == 8) return reinterpret_cast<const uint8_t*>(src)[int64_t{r} * cols + c];
  const int lo = low_bits(bits), pbits = high ? bits - lo : lo, per_word = 32 / pbits;
  const int units = cols / 32, unit = c / 32, in_unit = c % 32;
  const int tile = unit / 32, u = unit % 32, m = units - 32 * tile < 32 ? units - 32 * tile : 32;
  const int j = (high ? lo : 0) + in_unit / per_word, e = in_unit % per_word;
  const int64_t word = int64_t{r} * units * bits + 32 * bits * tile + j * m + u;
  return (src[word] >> ((e % 2) * 16 + pbits * (e / 2))) & ((1u << pbits) - 1);
}

// Device word o of the tiled layout from the host layout src: word w of piece (tile, i) is
// low-plane word w % (S lo) of lane w / (S lo) (w < 32 S lo), else a high-plane word; a lane's
// plane words are its blocks' in turn. inplace (3/5/6 bits): the words hold the in-place
// arrangement (qlinear_inplace.h), a block's low-plane words being its words 0..L-1 and its
// high-plane words its words L..bits-1 (L = low_bits); at 2 bits the in-place arrangement is the
// planes' one. Host and device: the test
// hook tile_bits_on_host runs it on the CPU.
__host__ __device__ uint32_t tile_bits_word(const uint32_t* src, int rows, int cols, int bits,
                                            int kblocks, int pieces_s, bool inplace, int64_t o) {
  const int lo = low_bits(bits), hi = bits - lo, per_piece = 32 * bits * pieces_s;
  const int w = static_cast<int>(o % per_piece);
  const int64_t ti = o / per_piece;
  const int npieces = kblocks / pieces_s;
  const int piece = static_cast<int>(ti % npieces), tile = static_cast<int>(ti / npieces);
  const bool high = w >= 32 * lo * pieces_s;
  const int pbits = high ? hi : lo, wl = high ? w - 32 * lo * pieces_s : w;
  const int lane = wl / (pbits * pieces_s), in_lane = wl % (pbits * pieces_s);
  const int b = piece * pieces_s + in_lane / pbits, word = in_lane % pbits, pairs = 16 / pbits;
  if (inplace && bits != 2 && bits != 8) {  // 2, 8 bits: the in-place arrangement is the planes'

    const int in_block = high ? lo + word : word;  // the block's word 0..bits-1
    auto q = [&](int k, int second) {
      int row = 0, col = 0;
      pair_position(tile, b, lane, k, row, col);
      return host_plane_value(src, rows, cols, bits, false, row, col + second) |
             host_plane_value(src, rows, cols, bits, true, row, col + second) << lo;
    };
    if (bits == 3) return inplace_word<3>(in_block, q);
    if (bits == 5) return inplace_word<5>(in_block, q);
    return inplace_word<6>(in_block, q);
  }
  uint32_t v = 0;
  for (int i = 0; i < pairs; ++i) {
    const int k = word * pairs + i;
    int row = 0, col = 0;
    pair_position(tile, b, lane, k, row, col);
    v |= host_plane_value(src, rows, cols, bits, high, row, col) << (pbits * i);
    v |= host_plane_value(src, rows, cols, bits, high, row, col + 1) << (16 + pbits * i);
  }
  return v;
}

// One thread per device word.
__global__ void tile_bits_kernel(const uint32_t* src, uint32_t* dst, int rows, int cols, int bits,
                                 int kblocks, int pieces_s, bool inplace, int64_t words) {
  const int64_t o = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (o < words) dst[o] = tile_bits_word(src, rows, cols, bits, kblocks, pieces_s, inplace, o);
}

// One thread per (tile, block, lane): its 32 values scaled to FP16 at their (row, column), in
// the original column order (16-byte stores of 8 columns without act-order).
template <int BITS>
__global__ void dequant_tiled_bits_kernel(Params p, int pieces_s, __half* out) {
  constexpr int kLo = StreamPlanes<BITS>::kLo, kHi = StreamPlanes<BITS>::kHi;
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= int64_t{p.tiles} * p.kblocks * 32) return;
  const int lane = static_cast<int>(i % 32), b = static_cast<int>((i / 32) % p.kblocks);
  const int tile = static_cast<int>(i / 32 / p.kblocks), sub = b % pieces_s;
  const uint8_t* piece = p.qweight + (int64_t{tile} * p.kblocks + b - sub) * 128 * BITS;
  uint32_t q[BITS];
  load_stream_words<kLo>(piece + (lane * pieces_s + sub) * 4 * kLo, q);
  if constexpr (kHi > 0)
    load_stream_words<kHi>(piece + 128 * kLo * pieces_s + (lane * pieces_s + sub) * 4 * kHi,
                           q + kLo);
  const __half2 base = __float2half2_rn(p.asym ? 1024.f : 1024.f + (1 << (BITS - 1)));
  // Pair (j, r) is row g + 8 (r % 2), columns 64b + 32 (j / 2) + 8t + 4 (j % 2) + 2 (r / 2):
  // a lane holds 8 consecutive columns of each of its two rows in each half of the block.
  __half v[2][2][8];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t a[4];
    if (p.inplace && p.asym)
      inplace_to_fragment<BITS, 0>(q, q + kLo, j, a);
    else if (p.inplace)
      inplace_to_fragment<BITS, 1u << (BITS - 1)>(q, q + kLo, j, a);
    else
      narrow_to_fragment<BITS>(q, q + kLo, j, base, a);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      memcpy(&v[r % 2][j / 2][4 * (j % 2) + 2 * (r / 2)], &a[r], 4);
    }
  }
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int rs = 0; rs < 2; ++rs) {
    const int row = 16 * tile + g + 8 * rs;
    if (row >= p.rows) continue;
    __half* dst = out + int64_t{row} * p.cols;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int c0 = 64 * b + 32 * h + 8 * t;
      if (c0 >= p.cols) continue;  // cols % 32 == 0: the 8 columns are all in or all out
      const int64_t sidx = (int64_t{tile} * p.groups_p + (c0 >> p.group_log2)) * 16 + 2 * g + rs;
      const __half2 s = __half2half2(static_cast<const __half*>(p.scales)[sidx]);
      const __half2 m =
          p.asym ? __half2half2(static_cast<const __half*>(p.mins)[sidx]) : __float2half2_rn(0.f);
      __half2 w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        __half2 qv;
        memcpy(&qv, &v[rs][h][2 * k], 4);
        w[k] = __hfma2(qv, s, m);
      }
      if (p.perm == nullptr) {
        uint4 packed;
        memcpy(&packed, w, 16);
        *reinterpret_cast<uint4*>(dst + c0) = packed;  // c0 % 8 == 0: 16-byte aligned
      } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          dst[p.perm[c0 + 2 * k]] = __low2half(w[k]);
          dst[p.perm[c0 + 2 * k + 1]] = __high2half(w[k]);
        }
      }
    }
  }
}

// Ring depth by piece size: 4 pieces of 1 or 2 blocks, 2 of 4 or 8 (8: 2 bits only). The
// symmetric in-place 3-bit kernel at 2 blocks per piece takes 2 (64 registers, no spills, ptxas
// -v; at 4 it takes 77, so 3 blocks of 8 warps (1 of 16) fit an SM instead of 4 (2) and the n <= 2
// split-K grids of the Llama shapes need more waves, bench/qlinear_notes.md session 11; capped at
// 64 it spills 48 bytes; asymmetric at 2 it spills). set_bits_stream_depth(4): the A/B.
// The shared-memory ring (qlinear_stream.cuh) of 4 slots per warp for symmetric in-place weights of
// 1 or 2 blocks per piece: -1: GYRE_CUDA_BITS_SMEM=0|4, else on at every width (+4-5% decode on
// H100 at 5 and 6 bits in session 12, +15% at 3 bits since the lean ring loop of session 25; at 2
// bits, with 1 block per piece, 645 against 582 tok/s for the register ring at 4 blocks in session
// 32, Llama-3-8B shape), off (0) or on (4): set_bits_smem_ring.
int g_ring = -1;
bool bits_smem_ring() {
  static const int env = [] {
    const char* e = std::getenv("GYRE_CUDA_BITS_SMEM");
    return e == nullptr || *e == 0 ? -1 : std::atoi(e);
  }();
  const int mode = g_ring >= 0 ? g_ring : env;
  return mode < 0 || mode == 4;
}

template <int BITS, bool INPLACE>
void launch_decode(const Params& p, int pieces_s, int budget, cudaStream_t stream) {
  if constexpr (INPLACE) {
    if (bits_smem_ring() && !p.asym) {
      if (pieces_s == 1 && stream_ring_fits<BITS, 1, true, false>(p, 0, budget, 4))
        return launch_stream_ring<BITS, 1, 4>(p, 0, budget, stream);
      if (pieces_s == 2 && stream_ring_fits<BITS, 2, true, false>(p, 0, budget, 4))
        return launch_stream_ring<BITS, 2, 4>(p, 0, budget, stream);
    }
  }
  if constexpr (BITS == 3 && INPLACE) {
    if (pieces_s == 2 && g_depth != 4 && !p.asym) {
      if (p.group == 32)
        return launch_stream_kernel<3, 2, 2, true, false, true>(p, 0, budget, stream);
      return launch_stream_kernel<3, 2, 2, false, false, true>(p, 0, budget, stream);
    }
  }
  if constexpr (BITS == 2)
    if (pieces_s == 8) return launch_stream_variant<BITS, 8, 2, INPLACE>(p, 0, budget, stream);
  if (pieces_s == 4) return launch_stream_variant<BITS, 4, 2, INPLACE>(p, 0, budget, stream);
  if (pieces_s == 2) return launch_stream_variant<BITS, 2, 4, INPLACE>(p, 0, budget, stream);
  launch_stream_variant<BITS, 1, 4, INPLACE>(p, 0, budget, stream);
}

template <int BITS>
void launch_width(const Params& p, int pieces_s, int budget, cudaStream_t stream) {
  if constexpr (BITS == 8) {  // in place, one block per piece (bits_tiled_layout) only
    GYRE_CHECK(p.inplace && pieces_s == 1, "qlinear: tiled 8-bit weights are in place, S = 1");
    if (bits_smem_ring() && !p.asym && stream_ring_fits<8, 1, true, false>(p, 0, budget, 4))
      return launch_stream_ring<8, 1, 4>(p, 0, budget, stream);
    return launch_stream_variant<8, 1, 4, true>(p, 0, budget, stream);
  } else {
    if (p.inplace) return launch_decode<BITS, true>(p, pieces_s, budget, stream);
    launch_decode<BITS, false>(p, pieces_s, budget, stream);
  }
}

void launch_chunk(const Params& p, int pieces_s, int budget, cudaStream_t stream) {
  switch (p.bits) {
    case 2:
      return launch_width<2>(p, pieces_s, budget, stream);
    case 3:
      return launch_width<3>(p, pieces_s, budget, stream);
    case 5:
      return launch_width<5>(p, pieces_s, budget, stream);
    case 6:
      return launch_width<6>(p, pieces_s, budget, stream);
    case 8:
      return launch_width<8>(p, pieces_s, budget, stream);
    default:
      fail("qlinear: no tiled narrow-width kernel for ", p.bits, " bits");
  }
}

}  // namespace

bool bits_stream_enabled() {
  if (g_stream < 0) {
    const char* e = std::getenv("GYRE_CUDA_BITS_STREAM");
    g_stream = e == nullptr || std::string(e) != "0" ? 1 : 0;
  }
  return g_stream == 1;
}

void set_bits_stream(int mode) {
  GYRE_CHECK(mode >= -1 && mode <= 1, "qlinear: bits stream mode must be -1, 0 or 1");
  g_stream = mode;
}

void set_bits_smem_ring(int mode) {
  GYRE_CHECK(mode == -1 || mode == 0 || mode == 4, "qlinear: bits ring mode must be -1, 0 or 4");
  g_ring = mode;
}

void set_bits8_stream(int mode) {
  GYRE_CHECK(mode >= -1 && mode <= 1, "qlinear: 8-bit stream mode must be -1, 0 or 1");
  g_stream8 = mode;
}

void set_bits_decode(int mode) {
  GYRE_CHECK(mode >= -1 && mode <= 1, "qlinear: bits decode mode must be -1, 0 or 1");
  g_decode = mode;
}

void set_bits_stream_pieces(int pieces) {
  GYRE_CHECK(pieces == 0 || pieces == 1 || pieces == 2 || pieces == 4 || pieces == 8,
             "qlinear: blocks per piece must be 0, 1, 2, 4 or 8 (8: 2 bits only)");
  g_pieces = pieces;
}

void set_bits_stream_warps(int budget) {
  GYRE_CHECK(budget >= 0 && budget <= 128, "qlinear: warp budget must be 0..128");
  g_warp_budget = budget;
}

void set_bits_stream_depth(int depth) {
  GYRE_CHECK(depth == 0 || depth == 2 || depth == 4, "qlinear: ring depth must be 0, 2 or 4");
  g_depth = depth;
}

void set_bits_stream_chunk(int tokens) {
  GYRE_CHECK(tokens >= 0 && tokens <= 8, "qlinear: tokens per pass must be 0..8");
  g_chunk = tokens;
}

int bits_tiled_layout(const QWeightDesc& d) {
  // x of one token (cols halves) must fit next to the reduction space in any sm_80+ block.
  if (d.scale_f32 || d.cols > kQlinearTiledBitsMaxCols || !bits_stream_enabled()) return 0;
  if (d.bits == 8 && !d.trellis)  // groups of 32+ (the kernels' scale indexing), f16 scales
    return bits8_stream_enabled() && d.group_size >= 32 ? 1 : 0;
  if (!d.narrow()) return 0;
  // GYRE_CUDA_BITS_PIECES=1|2|4|8: blocks per piece of every narrow width (measurements;
  // set_bits_stream_pieces takes precedence).
  static const int env_pieces = [] {
    const char* e = std::getenv("GYRE_CUDA_BITS_PIECES");
    const int v = e == nullptr ? 0 : std::atoi(e);
    return v == 1 || v == 2 || v == 4 || v == 8 ? v : 0;
  }();
  const int pieces = g_pieces != 0 ? g_pieces : env_pieces;
  if (pieces != 0) return pieces == 8 && d.bits != 2 ? 4 : pieces;
  // Symmetric: 1 block per piece at every width, with the shared-memory ring (session 32, decode
  // of the Llama-3-8B shape on H100: 2 bits 645 tok/s against 582 at 4 blocks with the register
  // ring, 3 bits 585 against 545 at 2 blocks; 5 bits 460 against 383 at 2). Round 7's register
  // ring had found the fewest loads per byte best where registers allowed (4 blocks at 2 bits, 2
  // at 3 and 6), but its 2-bit kernel at 4 blocks holds 94 registers: 2 blocks of 8 warps per SM
  // and split-K 1 (ncu, session 30). Asymmetric weights (session 7, summed over the five shapes
  // at n = 1, 2 and 8): 8 blocks at 2 bits, 4 at 3, 2 at 5 and 6.
  // With the in-place decode (session 11) the symmetric 6-bit kernel at 1 block fits 64
  // registers and beat 2 blocks on all five shapes at n = 1 and 2 (28672x4096 35.3 against 37.0
  // us, 4096x14336 18.4 against 21.1).
  if (d.bits == 6 && !d.asymmetric && !bits_decode_new()) return 2;
  return narrow_default_pieces(d.bits, d.asymmetric);
}

bool bits_inplace_layout(const QWeightDesc& d) {
  // 8 bits: the same words either way; only the PRMT decode is instantiated
  return bits_tiled_layout(d) > 0 && (bits_decode_new() || d.bits == 8);
}

void tile_bits_upload(const QWeightHost& w, const Params& p, int pieces_s, uint8_t* dst_q,
                      uint8_t* dst_scales, uint8_t* dst_mins) {
  {
    DeviceStage stage(w.qweight.size() + 16);
    check_cuda(cudaMemcpy(stage.p, w.qweight.data(), w.qweight.size(), cudaMemcpyHostToDevice),
               "cudaMemcpy (weight)");
    const int64_t words = int64_t{p.tiles} * p.kblocks * 32 * p.bits;
    tile_bits_kernel<<<static_cast<unsigned>((words + 255) / 256), 256>>>(
        reinterpret_cast<const uint32_t*>(stage.p), reinterpret_cast<uint32_t*>(dst_q), p.rows,
        p.cols, p.bits, p.kblocks, pieces_s, p.inplace, words);
    check_cuda(cudaGetLastError(), "tile_bits launch");
    check_cuda(cudaDeviceSynchronize(), "narrow weight tiling");
  }
  tile_scales_upload(w.scales.data(), p.asym ? w.mins.data() : nullptr, p, dst_scales, dst_mins);
}

std::vector<uint32_t> tile_bits_on_host(const QWeightHost& w, int pieces_s, bool inplace) {
  const QWeightDesc& d = w.desc;
  GYRE_CHECK((d.narrow() || (d.bits == 8 && !d.trellis)) && w.qweight.size() % 4 == 0,
             "tile_bits_on_host: layout");
  std::vector<uint32_t> src(w.qweight.size() / 4);
  memcpy(src.data(), w.qweight.data(), w.qweight.size());
  const int kblocks = ((d.cols + 63) / 64 + pieces_s - 1) / pieces_s * pieces_s;
  std::vector<uint32_t> out(static_cast<size_t>((d.rows + 15) / 16) * kblocks * 32 * d.bits);
  for (size_t o = 0; o < out.size(); ++o)
    out[o] = tile_bits_word(src.data(), d.rows, d.cols, d.bits, kblocks, pieces_s, inplace,
                            static_cast<int64_t>(o));
  return out;
}

void launch_gemv_bits_stream(const Params& p, int pieces_s, cudaStream_t stream) {
  int sms = 0, optin = 0;
  stream_device_limits(sms, optin);
  // Tokens per pass: all n (up to 8) while x leaves room for 3 blocks per SM, as for 4 bits.
  // Long rows (x of fit3 < n tokens): one pass while x fits one block per SM, else a pass of
  // n - fit2 tokens and one of fit2 (fit2: tokens that leave room for 2 blocks). Session 7 on
  // 4096x14336 (fit 7 / 3 / 2): n = 8 as 5 + 3 took 42-61 us against 46-84 us for round 7's
  // 3 + 3 + 2, n = 4 and 6 in one pass 24-35 against 29-57 us (bits_tiled_layout guarantees
  // that one token fits).
  Params one = p;
  one.n = 1;
  one.had_block = 0;
  one.norm_w = nullptr;
  const int per_token = stream_smem(one);
  // Once per block: a rotated layer's signs, or an act-order layer's gathered norm weights.
  const int signs = stream_smem(p) - p.n * per_token;
  auto fit = [&](int blocks) {
    return std::clamp(((optin - 8 * 1024) / blocks - signs) / per_token, 1, 8);
  };
  const int fit3 = fit(3), fit2 = fit(2), fit1 = fit(1);
  int chunk = fit3;
  if (g_chunk > 0)
    chunk = std::min(g_chunk, fit1);
  else if (p.n > fit3)
    chunk = p.n <= fit1 ? p.n : std::min(fit1, std::max(p.n - fit2, (p.n + 1) / 2));
  // Warps per SM: twice a resident wave at n <= 2 where the kernel stays within 64 registers
  // (2/3/5 bits at their default pieces), one wave otherwise (round 7); half a wave for one
  // pass of long rows at two blocks per SM of the asymmetric and 6-bit kernels (fewer split-K
  // blocks each staging x: n = 3 on 4096x14336 18.7-29.6 against 23.7-33.2 us; the symmetric
  // 2/3/5-bit kernels were 10-20% slower so).
  const bool long_one_pass = p.n == chunk && chunk > fit3 && chunk <= fit2;
  // GYRE_CUDA_BITS_WARPS=N: the warp budget of every launch (measurements; set_bits_stream_warps
  // takes precedence).
  static const int env_budget = [] {
    const char* e = std::getenv("GYRE_CUDA_BITS_WARPS");
    return e == nullptr ? 0 : std::clamp(std::atoi(e), 0, 128);
  }();
  const int budget = g_warp_budget != 0                         ? g_warp_budget
                     : env_budget != 0                          ? env_budget
                     : p.n <= 2 && p.bits < 6 && !p.asym        ? 64
                     : long_one_pass && (p.asym || p.bits >= 6) ? 16
                                                                : 32;
  for (int t0 = 0; t0 < p.n; t0 += chunk)
    launch_chunk(token_chunk(p, t0, std::min(chunk, p.n - t0)), pieces_s, budget, stream);
}

void launch_dequant_bits_tiled(const Params& p, int pieces_s, __half* out, cudaStream_t stream) {
  const int64_t pieces = int64_t{p.tiles} * p.kblocks * 32;
  const auto blocks = static_cast<unsigned>((pieces + 255) / 256);
  switch (p.bits) {
    case 2:
      return dequant_tiled_bits_kernel<2><<<blocks, 256, 0, stream>>>(p, pieces_s, out);
    case 3:
      return dequant_tiled_bits_kernel<3><<<blocks, 256, 0, stream>>>(p, pieces_s, out);
    case 5:
      return dequant_tiled_bits_kernel<5><<<blocks, 256, 0, stream>>>(p, pieces_s, out);
    case 6:
      return dequant_tiled_bits_kernel<6><<<blocks, 256, 0, stream>>>(p, pieces_s, out);
    case 8:
      return dequant_tiled_bits_kernel<8><<<blocks, 256, 0, stream>>>(p, pieces_s, out);
    default:
      fail("qlinear: no tiled narrow-width dequantization for ", p.bits, " bits");
  }
}

}  // namespace gyre::qlinear_detail
