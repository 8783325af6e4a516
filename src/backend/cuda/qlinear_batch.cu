// Quantized matmul for serving batches (n = 1..128 rows) on the tensor cores, register-fed: one
// pass over the weight per 64 tokens, each weight fragment reused for several n8 column tiles.
// Used for 8-bit weights and for 4-bit ones of 2048..6143 rows at n <= 32 (launch_batch) where
// the stream kernel does not run; other 4-bit cases go to the stream kernel of
// qlinear_batch_stream.cu, the cp.async / cluster kernel of qlinear_batch4.cu or the bulk-copy
// kernel of qlinear_batch_bulk.cu, each where it measured fastest.
//
// A warp owns MT 16-row tiles and NT n8 token tiles (so 8 * NT tokens) and walks the 64-column
// blocks ks, ks + ksplit, ...; ksplit warps of one block split the columns of the same tiles
// and are reduced in shared memory. Per block and 16-column step j it builds each tile's A
// fragment once (dequantized and scaled in FP16, as the GEMM does) and issues MT x NT
// mma.m16n8k16 with float accumulators. Why MT > 1: B fragments (x) come from L1 at 256 bytes
// per n8 tile and step against 128 weight bytes per tile, so L1 traffic per weight byte is
// 2 NT / MT; L1 (~128 B/clk/SM) must stay well ahead of the weight stream (~13 B/clk/SM).
//
// Weight fragments. 4-bit: the tiled layout (qlinear_tiled.cu): lane L's 16-byte piece of a
// (tile, block) holds rows g, g+8 for four steps. 8-bit: the host row-major layout; lane (g, t)
// loads columns 64b + 16t .. +15 of rows g and g+8 (16 bytes each) and step j uses its columns
// 4j .. 4j+3 (k = 2t, 2t+1 -> 4j, 4j+1; k = 2t+8, 2t+9 -> 4j+2, 4j+3). x follows the same
// column permutation, so both give the lane 8 contiguous halves per half block.
// Tokens beyond n read the last row of x and store nothing; tiles beyond the weight compute a
// copy of the last tile and store nothing; columns beyond cols get x = 0.
#include <algorithm>

#include "backend/cuda/qlinear_kernels.cuh"

namespace gyre::qlinear_detail {

void check_cuda(cudaError_t e, const char* what);              // qlinear.cu
void launch_batch4(const Params& p, cudaStream_t stream);      // qlinear_batch4.cu
void launch_batch_bulk(const Params& p, cudaStream_t stream);  // qlinear_batch_bulk.cu
bool batch_bulk_preferred(const Params& p);                    // qlinear_batch_bulk.cu
void launch_batch_stream(const Params& p, cudaStream_t stream, int pieces_s);  // (1 at 4 bits)
bool batch_stream_supported(const Params& p, int pieces_s);  // qlinear_batch_stream.cu
bool batch_stream_preferred(const Params& p);                // qlinear_batch_stream.cu

namespace {

constexpr int kWarps = 8;
constexpr int kRedFloats = 32;  // accumulators reduced per round (shared: 8 x 32 x 32 floats)
int g_batch_ksplit = 0, g_batch_mt = 0, g_batch_kernel = 0;

// Weight bytes (and raw scales) of one 64-column block for one tile.
template <int BITS>
struct Piece {
  uint4 q[BITS == 4 ? 1 : 2];  // 4-bit: rows g, g+8 in one; 8-bit: row g, row g+8
  uint32_t s[2], m[2];         // f16: (row g, row g+8) pairs per group half; f32: see below
  uint32_t s32[2][2], m32[2][2];
};

__device__ __forceinline__ uint32_t ld_u16(const void* base, int64_t idx) {
  return __ldg(static_cast<const unsigned short*>(base) + idx);
}

template <int BITS, bool G32>
__device__ __forceinline__ void fetch_piece(const Params& p, int tile, int b, int lane,
                                            Piece<BITS>& d) {
  const int g = lane >> 2, t = lane & 3;
  if constexpr (BITS == 4) {
    d.q[0] = load_stream(p.qweight + ((int64_t{tile} * p.kblocks + b) * 32 + lane) * 16);
    const int gi = G32 ? 2 * b : (64 * b) >> p.group_log2;
#pragma unroll
    for (int k = 0; k < (G32 ? 2 : 1); ++k) {
      const int64_t idx = (int64_t{tile} * p.groups_p + gi + k) * 16 + 2 * g;
      if (p.scale_f32) {
        const uint2 v =
            __ldg(reinterpret_cast<const uint2*>(static_cast<const float*>(p.scales) + idx));
        d.s32[k][0] = v.x;
        d.s32[k][1] = v.y;
        if (p.asym) {
          const uint2 w =
              __ldg(reinterpret_cast<const uint2*>(static_cast<const float*>(p.mins) + idx));
          d.m32[k][0] = w.x;
          d.m32[k][1] = w.y;
        }
      } else {
        d.s[k] = __ldg(
            reinterpret_cast<const unsigned int*>(static_cast<const __half*>(p.scales) + idx));
        if (p.asym)
          d.m[k] = __ldg(
              reinterpret_cast<const unsigned int*>(static_cast<const __half*>(p.mins) + idx));
      }
    }
  } else {
    const int c = 64 * b + 16 * t;
    const bool in = c < p.cols;
    const int cc = in ? c : 0;
    const int r0 = min(16 * tile + g, p.rows - 1), r1 = min(16 * tile + g + 8, p.rows - 1);
    d.q[0] = load_stream(p.qweight + int64_t{r0} * p.cols + cc);
    d.q[1] = load_stream(p.qweight + int64_t{r1} * p.cols + cc);
    if (!in) d.q[0] = d.q[1] = make_uint4(0, 0, 0, 0);
    const int groups = p.cols / p.group, gi = cc / p.group;
    const int64_t i0 = int64_t{r0} * groups + gi, i1 = int64_t{r1} * groups + gi;
    if (p.scale_f32) {
      d.s32[0][0] = __float_as_uint(__ldg(static_cast<const float*>(p.scales) + i0));
      d.s32[0][1] = __float_as_uint(__ldg(static_cast<const float*>(p.scales) + i1));
      if (p.asym) {
        d.m32[0][0] = __float_as_uint(__ldg(static_cast<const float*>(p.mins) + i0));
        d.m32[0][1] = __float_as_uint(__ldg(static_cast<const float*>(p.mins) + i1));
      }
    } else {
      d.s[0] = ld_u16(p.scales, i0) | ld_u16(p.scales, i1) << 16;
      if (p.asym) d.m[0] = ld_u16(p.mins, i0) | ld_u16(p.mins, i1) << 16;
    }
  }
}

// (row g, row g+8) scale or min of group half k as two broadcast half2.
template <int BITS>
__device__ __forceinline__ void scale_pair(const Params& p, const Piece<BITS>& d, int k, bool min,
                                           __half2& lo, __half2& hi) {
  if (p.scale_f32) {
    const uint32_t* v = min ? d.m32[k] : d.s32[k];
    lo = __float2half2_rn(__uint_as_float(v[0]));
    hi = __float2half2_rn(__uint_as_float(v[1]));
  } else {
    const __half2 v = as_half2(min ? d.m[k] : d.s[k]);
    lo = __low2half2(v);
    hi = __high2half2(v);
  }
}

// x for tokens (8 nt + g) of one block: [nt][half block] 8 halves each, in the lane's columns.
template <int BITS, int NT>
__device__ __forceinline__ void fetch_x(const Params& p, int tok0, int b, int lane,
                                        uint4 (&x)[NT][2]) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const __half* row = p.x + int64_t{min(tok0 + 8 * nt + g, p.n - 1)} * p.cols;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int c = BITS == 4 ? 64 * b + 32 * h + 8 * t : 64 * b + 16 * t + 8 * h;
      x[nt][h] = make_uint4(0, 0, 0, 0);
      if (c < p.cols) {
        if (p.perm == nullptr) {
          x[nt][h] = __ldg(reinterpret_cast<const uint4*>(row + c));
        } else {
          __half hx[8];
#pragma unroll
          for (int i = 0; i < 8; ++i) hx[i] = row[__ldg(p.perm + c + i)];
          memcpy(&x[nt][h], hx, 16);
        }
      }
    }
  }
}

// The A fragment of step j, as q - offset (exact), then scaled: one HFMA2 per register.
template <int BITS, bool G32>
__device__ __forceinline__ void fragment(const Params& p, const Piece<BITS>& d, int j,
                                         uint32_t a[4]) {
  __half2 r[4];
  if constexpr (BITS == 4) {
    const __half2 lo_base = __float2half2_rn(p.asym ? 1024.f : 1032.f);
    const __half2 hi_base = __float2half2_rn(p.asym ? -64.f : -72.f);
    const uint32_t words[4] = {d.q[0].x, d.q[0].y, d.q[0].z, d.q[0].w};
    uint32_t raw[4];
    int4_word_to_fragment(words[j], lo_base, hi_base, raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) r[i] = as_half2(raw[i]);
  } else {
    const __half2 base = as_half2(p.asym ? 0x64006400u : 0x64806480u);  // 1024 or 1152
    const uint32_t w0[4] = {d.q[0].x, d.q[0].y, d.q[0].z, d.q[0].w};
    const uint32_t w1[4] = {d.q[1].x, d.q[1].y, d.q[1].z, d.q[1].w};
    r[0] = __hsub2(as_half2(__byte_perm(w0[j], 0x64646464u, 0x5140u)), base);
    r[1] = __hsub2(as_half2(__byte_perm(w1[j], 0x64646464u, 0x5140u)), base);
    r[2] = __hsub2(as_half2(__byte_perm(w0[j], 0x64646464u, 0x5342u)), base);
    r[3] = __hsub2(as_half2(__byte_perm(w1[j], 0x64646464u, 0x5342u)), base);
  }
  const int k = BITS == 4 && G32 ? j / 2 : 0;
  __half2 s_lo, s_hi, m_lo = __float2half2_rn(0.f), m_hi = m_lo;
  scale_pair<BITS>(p, d, k, false, s_lo, s_hi);
  if (p.asym) scale_pair<BITS>(p, d, k, true, m_lo, m_hi);
  const __half2 v[4] = {__hfma2(r[0], s_lo, m_lo), __hfma2(r[1], s_hi, m_hi),
                        __hfma2(r[2], s_lo, m_lo), __hfma2(r[3], s_hi, m_hi)};
  memcpy(a, v, 16);
}

template <int BITS, bool G32, int MT, int NT, int U>
__global__ void __launch_bounds__(kWarps * 32) batch_kernel(Params p, int token_groups) {
  cuda::pdl_begin();  // launched with PDL (launch.h)
  __shared__ float4 red[kWarps][kRedFloats / 4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int tok0 = (blockIdx.x % token_groups) * 8 * NT;
  const int tile_group = (blockIdx.x / token_groups) * (kWarps / p.ksplit) + warp / p.ksplit;
  const int ks = warp % p.ksplit;
  int tiles[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) tiles[mt] = min(tile_group * MT + mt, p.tiles - 1);

  float acc[MT * NT * 4];
#pragma unroll
  for (int i = 0; i < MT * NT * 4; ++i) acc[i] = 0.f;

  const int step = U * p.ksplit;
  for (int b0 = ks; b0 < p.kblocks; b0 += step) {
    Piece<BITS> w[U][MT];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        fetch_piece<BITS, G32>(p, tiles[mt], min(b0 + u * p.ksplit, p.kblocks - 1), lane, w[u][mt]);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int b = b0 + u * p.ksplit;
      if (b >= p.kblocks) break;
      uint4 x[NT][2];
      fetch_x<BITS, NT>(p, tok0, b, lane, x);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) fragment<BITS, G32>(p, w[u][mt], j, a[mt]);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint32_t xs[4] = {x[nt][j / 2].x, x[nt][j / 2].y, x[nt][j / 2].z, x[nt][j / 2].w};
          const uint32_t b0r = xs[2 * (j % 2)], b1r = xs[2 * (j % 2) + 1];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) mma_16816(&acc[(mt * NT + nt) * 4], a[mt], b0r, b1r);
        }
      }
    }
  }

  // Split-K reduction into the group's first warp, kRedFloats accumulators per round.
  if (p.ksplit > 1) {
#pragma unroll
    for (int r0 = 0; r0 < MT * NT * 4; r0 += kRedFloats) {
      constexpr int kTotal = MT * NT * 4;
      if (ks != 0) {
#pragma unroll
        for (int i = 0; i < kRedFloats / 4; ++i) {
          if (r0 + 4 * i < kTotal)
            red[warp][i][lane] = make_float4(acc[r0 + 4 * i], acc[r0 + 4 * i + 1],
                                             acc[r0 + 4 * i + 2], acc[r0 + 4 * i + 3]);
        }
      }
      __syncthreads();
      if (ks == 0) {
        for (int o = 1; o < p.ksplit; ++o) {
#pragma unroll
          for (int i = 0; i < kRedFloats / 4; ++i) {
            if (r0 + 4 * i < kTotal) {
              const float4 v = red[warp + o][i][lane];
              acc[r0 + 4 * i] += v.x;
              acc[r0 + 4 * i + 1] += v.y;
              acc[r0 + 4 * i + 2] += v.z;
              acc[r0 + 4 * i + 3] += v.w;
            }
          }
        }
      }
      __syncthreads();
    }
    if (ks != 0) return;
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int tile = tile_group * MT + mt;
    if (tile >= p.tiles) break;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const float* c = &acc[(mt * NT + nt) * 4];
      if (p.swiglu_hidden > 0) {
        // Gate row g (c 0, 1) and its up row g + 8 (c 2, 3) of hidden row 8 tile + g.
        const int hrow = 8 * tile + g;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int tok = tok0 + 8 * nt + 2 * t + i;
          if (hrow < p.swiglu_hidden && tok < p.n)
            p.y[int64_t{tok} * p.swiglu_hidden + swiglu_at(p, hrow)] =
                swiglu_out(p, tok, hrow, c[i], c[2 + i]);
        }
        continue;
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = 16 * tile + g + 8 * (i / 2), tok = tok0 + 8 * nt + 2 * t + (i % 2);
        if (row < p.rows && tok < p.n) {
          float v = c[i];
          if (p.bias != nullptr) v += __half2float(p.bias[row]);
          store_out(p, tok, row, v);
        }
      }
    }
  }
}

template <int BITS, int MT, int NT>
void launch(const Params& p, int ks_knob, cudaStream_t stream) {
  constexpr int U = 2;
  const int token_groups = (p.n + 8 * NT - 1) / (8 * NT);
  const int tile_groups = (p.tiles + MT - 1) / MT;
  int ks = ks_knob;
  if (ks == 0) {
    // Enough warps to cover the weight stream's latency (~3000 on an H100), keeping at least
    // two batches of U column blocks per warp.
    ks = 1;
    while (ks < kWarps && int64_t{tile_groups} * token_groups * ks < 3000 &&
           p.kblocks / (2 * ks) >= 2 * U)
      ks *= 2;
  }
  Params q = p;
  q.ksplit = ks;
  const int per_block = kWarps / ks;
  const unsigned blocks =
      static_cast<unsigned>((tile_groups + per_block - 1) / per_block * token_groups);
  if (BITS == 4 && p.group == 32)
    qlaunch(batch_kernel<BITS, true, MT, NT, U>, blocks, kWarps * 32, 0, stream, q, token_groups);
  else
    qlaunch(batch_kernel<BITS, false, MT, NT, U>, blocks, kWarps * 32, 0, stream, q, token_groups);
}

template <int BITS, int MT>
void launch_by_n(const Params& p, int ks, cudaStream_t stream) {
  if (p.n <= 8) return launch<BITS, MT, 1>(p, ks, stream);
  if (p.n <= 16) return launch<BITS, MT, 2>(p, ks, stream);
  if (p.n <= 32) return launch<BITS, MT, 4>(p, ks, stream);
  return launch<BITS, MT, 8>(p, ks, stream);
}

}  // namespace

bool batch_prefers_gemm(const Params& p) {
  // Measured on H100 (bench/qlinear_notes.md, round 3): the WMMA GEMM beats both batch kernels
  // on large weights from n = 65 (8-bit from 7168 rows, 4-bit from 24576 rows).
  return p.n > 64 && p.tiles >= (p.bits == 8 ? 448 : 1536);
}

void launch_batch(const Params& p, cudaStream_t stream) {
  // Choices measured on H100 with the Llama-3-8B shapes (bench/qlinear_notes.md, round 3).
  if (p.bits == 4) {
    // Automatic: the bulk-copy kernel where it measured faster (batch_bulk_preferred), else the
    // cp.async / cluster kernel, except 2048..6143 rows at n <= 32, where the register-fed
    // kernel's many warps win.
    // Kernel 6: the automatic choice without the stream batch kernel (the round-5 dispatch,
    // for benchmarks); kernel 5 where the stream kernel cannot run: the automatic choice.
    const bool automatic = g_batch_kernel == 0 || g_batch_kernel == 5 || g_batch_kernel == 6;
    if (g_batch_kernel == 2 && p.perm == nullptr) return launch_batch_bulk(p, stream);
    if (g_batch_kernel == 3) return launch_batch4(p, stream);
    if ((g_batch_kernel == 5 && batch_stream_supported(p, 1)) ||
        (g_batch_kernel == 0 && batch_stream_preferred(p)))
      return launch_batch_stream(p, stream, 1);
    if (automatic && batch_bulk_preferred(p)) return launch_batch_bulk(p, stream);
    if (automatic && !(p.n <= 32 && p.tiles >= 128 && p.tiles < 384))
      return launch_batch4(p, stream);
  }
  // One 16-row tile per warp up to 32 tokens; two beyond (x reuse), with a 2-way split-K on
  // large weights (more warps would each hold 64 accumulators).
  int mt = g_batch_mt, ks = g_batch_ksplit;
  if (mt == 0) mt = p.n <= 32 ? 1 : 2;
  if (ks == 0 && mt == 2 && p.tiles >= 512) ks = 2;
  if (p.bits == 4) {
    if (mt == 1) return launch_by_n<4, 1>(p, ks, stream);
    return launch_by_n<4, 2>(p, ks, stream);
  }
  if (mt == 1) return launch_by_n<8, 1>(p, ks, stream);
  return launch_by_n<8, 2>(p, ks, stream);
}

void set_batch_kernel(int kernel) {
  g_batch_kernel = kernel;
}
void set_batch_ksplit(int ksplit) {
  g_batch_ksplit = ksplit;
}
void set_batch_tiles_per_warp(int mt) {
  g_batch_mt = mt;
}

}  // namespace gyre::qlinear_detail
