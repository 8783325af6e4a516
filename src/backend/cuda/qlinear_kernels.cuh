// Device helpers shared by the quantized GEMV, GEMM and dequantization kernels: streaming
// loads, per-group scales, and the int4/int8 -> half conversion of one 16-byte chunk.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/launch.h"
#include "backend/cuda/out_split.h"

namespace gyre::qlinear_detail {

void check_cuda(cudaError_t e, const char* what);  // qlinear.cu

// Host-layout bytes staged on the device for a repack at upload, freed on every path.
struct DeviceStage {
  uint8_t* p = nullptr;
  explicit DeviceStage(size_t bytes) {
    check_cuda(cudaMalloc(&p, bytes), "cudaMalloc (weight staging)");
  }
  ~DeviceStage() { cudaFree(p); }
  DeviceStage(const DeviceStage&) = delete;
  DeviceStage& operator=(const DeviceStage&) = delete;
};

struct Params {
  const uint8_t* qweight;
  const void* scales;
  const void* mins;
  const int32_t* perm;
  const int32_t* inv_perm = nullptr;  // with perm (QWeightDevice::inv_perm)
  const __half* x;
  __half* y;
  const __half* bias;
  int rows, cols, n, group, bits;
  int ksplit;  // GEMV: warps sharing one row group (1, 2 or 4; 4-bit: up to 16)
  bool scale_f32, asym;
  // 4-bit tiled device layout (see qlinear_tiled.cu): tiles of 16 rows, blocks of 64 columns,
  // scale groups per tile row (padded), log2 of the group size.
  int tiles = 0, kblocks = 0, groups_p = 0, group_log2 = 0;
  // Tiled 2/3/5/6-bit weights: the in-place word arrangement (qlinear_inplace.h).
  bool inplace = false;
  cuda::OutSplit split;   // parts > 0: outputs split over several tensors (y unused)
  int swiglu_hidden = 0;  // 4-bit GEMV: > 0 for a gate/up weight (out_split.h) -> y [n, hidden]
  // y += x . W instead of y = (the residual add folded into the matmul; y is rounded to FP16
  // first, as a separate matmul + add would round it).
  bool accumulate = false;
  // A mixed weight's last part (cuda_qmixed.cc): prior [n, rows] holds the earlier parts' sum,
  // which each output completes (rounded to FP16 first, as accumulate rounds) before the split or
  // SwiGLU epilogue, so that no separate split or SwiGLU kernel runs after the parts.
  const __half* prior = nullptr;
  // The stream GEMV only: x (and the norm's row) came from a kernel before the previous one, which
  // is a part of the same mixed weight whose sum only the epilogue reads (prior, or y under
  // accumulate). The kernel then stages and computes before its PDL wait, overlapping that part.
  bool late_wait = false;
  // Plain outputs only: a SwiGLU whose gate another weight computed (a fused weight of groups:
  // gate and up differ in layout). Output row r is silu(gate_in[tok, r]) * (its product rounded
  // to FP16, as a stored up row), stored at y[tok, r] (n = 1 with y_index: y[y_index[r]]).
  const __half* gate_in = nullptr;
  // SwiGLU at n = 1 only: hidden row h goes to y[y_index[h]] (the decode row of the mixed weight
  // that reads it next, QMixedDevice::row) instead of y[h].
  const int32_t* y_index = nullptr;
  // With accumulate (every kernel, through store_out): each new y[tok, row] also goes to
  // y_perm[tok * rows + y_perm_index[row]], the residual in the column order of the act-order
  // weight that reads it next (its inv_perm), so that weight's GEMV stages x without permuting.
  __half* y_perm = nullptr;
  const int32_t* y_perm_index = nullptr;
  // The 4-bit stream GEMV (qlinear_gemv_stream.cu) only: x is RMS-normalised per token and
  // multiplied by norm_w [cols] (original column order) before use.
  const __half* norm_w = nullptr;
  float norm_eps = 0.f;
  // The stream GEMV only: load the norm weights before the PDL wait (norm_ahead; an A/B knob,
  // GYRE_CUDA_NORM_AHEAD=0 turns it off).
  bool norm_ahead = false;
  // The stream GEMV only (no act-order, no rotation), n = 1, x_cols > 0: x and norm_w point
  // x_offset columns into a shared row of x_cols (a multiple of 64) and its norm weights, which
  // normalise over the whole row (the mean over norm_cols). A mixed weight's parts reading the
  // one decode row laid out for all of them (qlinear.cu's fused_params sets the pointers).
  int x_cols = 0, x_offset = 0, norm_cols = 0;
  // The stream GEMV only: a rotated layer's R^T (backend/cpu/hadamard.h) applied to the staged x
  // (after the norm): each had_block-block of had_signs .* x through the Walsh-Hadamard
  // transform, times had_scale = 1 / sqrt(had_block). had_block 0: none.
  const int8_t* had_signs = nullptr;
  int had_block = 0;
  float had_scale = 0.f;
};

// Launches with programmatic dependent launch (launch.h) unless GYRE_QLINEAR_PDL=0 (an A/B knob
// for benchmarks; qlinear.cu).
bool qlinear_pdl();
template <typename... KernelArgs, typename... Args>
void qlaunch(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
             Args&&... args) {
  if (qlinear_pdl()) return cuda::launch(kernel, grid, block, smem, s, std::forward<Args>(args)...);
  kernel<<<grid, block, smem, s>>>(std::forward<Args>(args)...);
}

// v completed by the prior sum of output row `row` of token tok (Params::prior), if any.
__device__ __forceinline__ float with_prior(const Params& p, int tok, int row, float v) {
  if (p.prior == nullptr) return v;
  return __half2float(p.prior[int64_t{tok} * p.rows + row]) + __half2float(__float2half_rn(v));
}

// A SwiGLU weight's output for hidden row `hrow` of token tok from its gate row's and up row's
// sums (out_split.h's interleave); with a prior each sum is first completed and stored-rounded
// to FP16, as the separate matmul + SwiGLU kernels round them.
__device__ __forceinline__ __half swiglu_out(const Params& p, int tok, int hrow, float gate,
                                             float up) {
  if (p.prior != nullptr) {
    const int gate_row = 2 * hrow - hrow % cuda::kSwigluBlock;
    gate = __half2float(__float2half_rn(with_prior(p, tok, gate_row, gate)));
    up = __half2float(__float2half_rn(with_prior(p, tok, gate_row + cuda::kSwigluBlock, up)));
  }
  return __float2half_rn(cuda::silu_times(gate, up));
}

// Where hidden row hrow of a SwiGLU output goes in its token's row (Params::y_index).
__device__ __forceinline__ int swiglu_at(const Params& p, int hrow) {
  return p.y_index != nullptr ? __ldg(p.y_index + hrow) : hrow;
}

// Output row `row` of token `tok`: into y [n, rows], or into the split outputs. GATE: the kernel
// honours Params::gate_in (the decode GEMVs; left out of the serving-batch and GEMM kernels, whose
// registers it raised, and which the host never gives a gate).
template <bool GATE = false>
__device__ __forceinline__ void store_out(const Params& p, int tok, int row, float v) {
  v = with_prior(p, tok, row, v);
  if (GATE && p.gate_in != nullptr) {
    const float up = __half2float(__float2half_rn(v));
    const float gate = __half2float(p.gate_in[int64_t{tok} * p.rows + row]);
    p.y[int64_t{tok} * p.rows + swiglu_at(p, row)] = __float2half_rn(cuda::silu_times(gate, up));
    return;
  }
  if (p.split.parts == 0) {
    __half* dst = p.y + int64_t{tok} * p.rows + row;
    // The index load first, so that it and the residual's load are in flight together.
    const int at = p.y_perm != nullptr ? __ldg(p.y_perm_index + row) : 0;
    if (p.accumulate) v = __half2float(*dst) + __half2float(__float2half_rn(v));
    const __half h = __float2half_rn(v);
    *dst = h;
    if (p.y_perm != nullptr) p.y_perm[int64_t{tok} * p.rows + at] = h;
  } else
    cuda::split_store(p.split, tok, row, v);
}

// The serving-batch kernel's blocks-per-piece argument for trellis-coded weights
// (qlinear_batch_stream.cu).
inline constexpr int kBatchTrellis = 0;

// p restricted to its tokens [t0, t0 + n): x and the outputs (y, SwiGLU's, split ones) advanced.
inline Params token_chunk(const Params& p, int t0, int n) {
  Params c = p;
  c.n = n;
  c.x = p.x + int64_t{t0} * p.cols;  // x_cols > 0: n = 1
  if (p.prior != nullptr) c.prior = p.prior + int64_t{t0} * p.rows;
  if (p.swiglu_hidden > 0) {
    c.y = p.y + int64_t{t0} * p.swiglu_hidden;
  } else if (p.split.parts == 0) {
    c.y = p.y + int64_t{t0} * p.rows;
    if (p.y_perm != nullptr) c.y_perm = p.y_perm + int64_t{t0} * p.rows;
  } else {
    for (int i = 0; i < p.split.parts; ++i) {
      const int width = p.split.end[i] - (i == 0 ? 0 : p.split.end[i - 1]);
      c.split.out[i] = p.split.out[i] + int64_t{t0} * width;
    }
  }
  return c;
}

// Weights are read once: keep them out of L1 so x stays there.
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ __forceinline__ __half2 as_half2(uint32_t v) {
  __half2 h;
  memcpy(&h, &v, 4);
  return h;
}

// Scale and min (zero when symmetric) of scale entry idx, broadcast to both halves.
__device__ __forceinline__ void load_scale(const Params& p, int64_t idx, __half2& s, __half2& m) {
  if (p.scale_f32) {
    s = __float2half2_rn(static_cast<const float*>(p.scales)[idx]);
    m = p.asym ? __float2half2_rn(static_cast<const float*>(p.mins)[idx]) : __float2half2_rn(0.f);
  } else {
    s = __half2half2(static_cast<const __half*>(p.scales)[idx]);
    m = p.asym ? __half2half2(static_cast<const __half*>(p.mins)[idx]) : __float2half2_rn(0.f);
  }
}

// One 16-byte chunk -> BITS == 4: 16 half2 (32 columns), BITS == 8: 8 half2 (16 columns), in
// column order. 0x6400 | q is the half 1024 + q (the unit in the last place of 1024 is 1), so
// subtracting 1024 (+ the symmetric offset) recovers q - offset exactly; one multiply (or FMA
// with the min) applies the group's scale.
template <int BITS>
__device__ __forceinline__ void dequant_chunk(uint4 q, __half2 s, __half2 m, bool asym,
                                              __half2* w) {
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
  if constexpr (BITS == 4) {
    const __half2 base = as_half2(asym ? 0x64006400u : 0x64086408u);  // 1024 or 1032
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t v = ((words[i] >> (4 * k)) & 0x000F000Fu) | 0x64006400u;
        const __half2 qi = __hsub2(as_half2(v), base);
        w[4 * i + k] = __hfma2(qi, s, m);  // m is zero when symmetric: no select
      }
    }
  } else {
    const __half2 base = as_half2(asym ? 0x64006400u : 0x64806480u);  // 1024 or 1152
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        // Bytes (2k, 2k+1) of the word under 0x64 exponent bytes.
        const uint32_t v = __byte_perm(words[i], 0x64646464u, k ? 0x5342u : 0x5140u);
        const __half2 qi = __hsub2(as_half2(v), base);
        w[2 * i + k] = __hfma2(qi, s, m);
      }
    }
  }
}

// COLS activations of token t starting at packed column c0, as half2 pairs (gathered through
// perm for act-order weights).
template <int COLS>
__device__ __forceinline__ void load_x(const Params& p, int t, int c0, __half2* xv) {
  const __half* row = p.x + static_cast<int64_t>(t) * p.cols;
  if (p.perm == nullptr) {
    const uint4* src = reinterpret_cast<const uint4*>(row + c0);
#pragma unroll
    for (int i = 0; i < COLS / 8; ++i) {
      const uint4 v = __ldg(src + i);
      xv[4 * i + 0] = as_half2(v.x);
      xv[4 * i + 1] = as_half2(v.y);
      xv[4 * i + 2] = as_half2(v.z);
      xv[4 * i + 3] = as_half2(v.w);
    }
  } else {
#pragma unroll
    for (int j = 0; j < COLS / 2; ++j) {
      xv[j] = __halves2half2(row[__ldg(p.perm + c0 + 2 * j)], row[__ldg(p.perm + c0 + 2 * j + 1)]);
    }
  }
}

// One u32 word of the 4-bit tiled layout -> the 4 f16x2 registers of an m16n8k16 A fragment,
// each holding q - offset exactly. Nibbles 0-3 / 16-19 -> reg 0, 4-7 / 20-23 -> reg 1 (read as
// 16q under the 0x6400 exponent and scaled by 1/16 in the same FMA), 8-11 / 24-27 -> reg 2,
// 12-15 / 28-31 -> reg 3. lo_base = 1024 + offset, hi_base = -(64 + offset).
__device__ __forceinline__ void int4_word_to_fragment(uint32_t w, __half2 lo_base, __half2 hi_base,
                                                      uint32_t a[4]) {
  const __half2 sixteenth = __float2half2_rn(0.0625f);
  const uint32_t w8 = w >> 8;
  const __half2 r0 = __hsub2(as_half2((w & 0x000F000Fu) | 0x64006400u), lo_base);
  const __half2 r1 = __hfma2(as_half2((w & 0x00F000F0u) | 0x64006400u), sixteenth, hi_base);
  const __half2 r2 = __hsub2(as_half2((w8 & 0x000F000Fu) | 0x64006400u), lo_base);
  const __half2 r3 = __hfma2(as_half2((w8 & 0x00F000F0u) | 0x64006400u), sixteenth, hi_base);
  memcpy(&a[0], &r0, 4);
  memcpy(&a[1], &r1, 4);
  memcpy(&a[2], &r2, 4);
  memcpy(&a[3], &r3, 4);
}

// End of one scale group in the n <= 8 GEMVs: acc += s * (the group's sums cg) (+ m * the sums of
// x, cx, when asymmetric) for rows g / g + 8 (s.x / s.y); cg and cx restart at zero.
__device__ __forceinline__ void flush_group(float (&acc)[4], float (&cg)[4], float (&cx)[4],
                                            float2 s, float2 m, bool asym) {
  acc[0] += s.x * cg[0];
  acc[1] += s.x * cg[1];
  acc[2] += s.y * cg[2];
  acc[3] += s.y * cg[3];
  if (asym) {
    acc[0] += m.x * cx[0];
    acc[1] += m.x * cx[1];
    acc[2] += m.y * cx[2];
    acc[3] += m.y * cx[3];
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) cg[i] = cx[i] = 0.f;
}

// c += A (16x16, row) * B (16x8, col), FP16 inputs, float accumulators (sm_80+).
__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], uint32_t b0,
                                          uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Scales (and mins) of tile rows g and g + 8 for padded group gi of the tiled layout, whose
// scale array is [tiles][groups_p][16] with row order 0, 8, 1, 9, ... (one 2-element load).
__device__ __forceinline__ float2 load_tile_pair(const void* base, bool f32, int64_t idx) {
  if (f32) return __ldg(reinterpret_cast<const float2*>(static_cast<const float*>(base) + idx));
  const uint32_t v =
      __ldg(reinterpret_cast<const unsigned int*>(static_cast<const __half*>(base) + idx));
  return __half22float2(as_half2(v));
}

// raw (4 f16x2 registers of an A fragment, q - offset) -> raw * s + m, one HFMA2 per register:
// registers 0 and 2 hold row g, 1 and 3 row g + 8.
__device__ __forceinline__ void scale_fragment(const uint32_t raw[4], __half2 s_lo, __half2 s_hi,
                                               __half2 m_lo, __half2 m_hi, uint32_t a[4]) {
  const __half2 v[4] = {
      __hfma2(as_half2(raw[0]), s_lo, m_lo), __hfma2(as_half2(raw[1]), s_hi, m_hi),
      __hfma2(as_half2(raw[2]), s_lo, m_lo), __hfma2(as_half2(raw[3]), s_hi, m_hi)};
  memcpy(a, v, 16);
}

// MT A fragments times NT tokens' B fragments (words jj*2, jj*2+1 of each x) into acc
// [MT][NT][4].
template <int MT, int NT>
__device__ __forceinline__ void mma_tiles(float* acc, const uint32_t (&a)[MT][4], int jj,
                                          const uint4 (&x)[NT]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const uint32_t b0 = jj ? x[nt].z : x[nt].x, b1 = jj ? x[nt].w : x[nt].y;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) mma_16816(&acc[(mt * NT + nt) * 4], a[mt], b0, b1);
  }
}

// Step j (0..3) of one 64-column block for MT 16-row tiles x NT 8-token tiles: each tile's
// 4-bit word j becomes an A fragment scaled (and shifted by the min) in FP16, then multiplied
// with the tokens' B fragments (jj = j % 2). Shared by the serving-batch kernels
// (qlinear_batch4.cu, qlinear_batch_bulk.cu).
template <int MT, int NT>
__device__ __forceinline__ void mma_scaled_step(float* acc, const uint4 (&q)[MT], int j,
                                                const uint4 (&x)[NT], const __half2 (&s_lo)[MT],
                                                const __half2 (&s_hi)[MT],
                                                const __half2 (&m_lo)[MT],
                                                const __half2 (&m_hi)[MT], __half2 lo_base,
                                                __half2 hi_base) {
  uint32_t a[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const uint32_t words[4] = {q[mt].x, q[mt].y, q[mt].z, q[mt].w};
    uint32_t raw[4];
    int4_word_to_fragment(words[j], lo_base, hi_base, raw);
    scale_fragment(raw, s_lo[mt], s_hi[mt], m_lo[mt], m_hi[mt], a[mt]);
  }
  mma_tiles<MT, NT>(acc, a, j & 1, x);
}

// Stores one reduced accumulator of a serving-batch kernel: fragment element i (0..3) of row
// gg of `tile` for token tok. SwiGLU weights (gate/up interleaved by 8 rows): the gate element
// (i = 0, 1) stores silu(v) * up(), the up element (i = 2, 3) stores nothing.
template <bool GATE = false, class Up>
__device__ __forceinline__ void store_batch_element(const Params& p, int tile, int gg, int i,
                                                    int tok, float v, Up&& up) {
  if (p.swiglu_hidden > 0) {
    const int hrow = 8 * tile + gg;
    if (i < 2 && hrow < p.swiglu_hidden)
      p.y[int64_t{tok} * p.swiglu_hidden + swiglu_at(p, hrow)] = swiglu_out(p, tok, hrow, v, up());
    return;
  }
  const int row = 16 * tile + gg + 8 * (i / 2);
  if (row >= p.rows) return;
  if (p.bias != nullptr) v += __half2float(p.bias[row]);
  store_out<GATE>(p, tok, row, v);
}

// The n <= 8 GEMVs' epilogue (qlinear_tiled.cu, qlinear_gemv4.cu): lane (g, t) holds rows g,
// g + 8 of `tile` for tokens 2t, 2t + 1 (acc[2 * (row half) + token]).
__device__ __forceinline__ void store_gemv_tile(const Params& p, int tile, int g, int t,
                                                const float (&acc)[4]) {
  if (tile >= p.tiles) return;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int tok = 2 * t + (i % 2);
    if (tok < p.n)
      store_batch_element<true>(p, tile, g, i, tok, acc[i], [&] { return acc[(2 + i) & 3]; });
  }
}

// The n <= 8 GEMVs' end: the ksplit warps of a tile (consecutive warps of the block) add their
// partial sums in shared memory and the first of them stores the tile.
__device__ __forceinline__ void reduce_store_gemv_tile(const Params& p, float4 (&partial)[16][32],
                                                       int warp, int ks, int tile,
                                                       float (&acc)[4]) {
  const int lane = threadIdx.x & 31;
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
  store_gemv_tile(p, tile, lane >> 2, lane & 3, acc);
}

}  // namespace gyre::qlinear_detail
