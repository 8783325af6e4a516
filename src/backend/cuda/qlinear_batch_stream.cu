// Serving-batch matmul (n = 9..64) of 4-bit weights and of tiled 2/3/5/6-bit weights (in-place
// arrangement, qlinear_bits_stream.cu), built like the stream GEMV (qlinear_stream.cuh):
// x staged once per thread block in shared memory, every warp keeping D column blocks of weights
// (and their scales) in flight in a register ring, the first D requested before the PDL wait;
// the math of the tensor-core batch kernels (dequantized A fragments from registers, x as B
// from shared memory, mma.m16n8k16 with float accumulators, mma_scaled_step).
//
// Why (bench/qlinear_notes.md, rounds 4 and 5): every earlier batch kernel streams only
// ~10-16 GB/s per thread block, too few bytes in flight per SM; the register ring fixed that for
// the n = 1 GEMV. Here it is applied to 9..64 tokens.
//
// The narrow widths had no such kernel: above 8 tokens they were dequantized to FP16 for cuBLAS,
// writing and reading 2 bytes per weight every step (or ran the GEMV once per 8 tokens).
//
// Work split: a tile group is W = 8 or 16 warps x MT 16-row tiles; a block runs a range of its
// units (64-column blocks at 4 bits, batch_unit_blocks blocks at 2/3/5/6 bits) and stages x [8
// NT tokens][those columns] (its size bounds the range). Two partitions (see Range): a grid of
// K-chunks, or stream-K (one equal range of (group, column block) pairs per block, one wave). A
// group run by one block stores directly. Otherwise the pieces' partial fragments meet in a global
// float workspace by vector atomics (red.global.add.v4.f32) in fragment order, and the warp that
// arrives last for its tiles (a per-warp counter) reads the sums, clears the workspace and counter
// for the next launch, and runs the same epilogue (bias, split outputs, SwiGLU, accumulate). The
// workspace is a fixed
// __device__ array: no allocation (graph capture) and no memset; kernels of this family on one
// stream never overlap in their post-wait parts (PDL waits for the previous grid's completion),
// but two streams running them at once would share it (the CUDA backend has one stream).
#include <algorithm>

#include "backend/cuda/qlinear_batch_stream.cuh"
#include "core/error.h"

namespace gyre::qlinear_detail {

void check_cuda(cudaError_t e, const char* what);  // qlinear.cu
void prepare_batch_stream();

namespace {

constexpr int kXPad = kBatchXPad;
// x per block of 8 warps (two to three blocks in an SM's 227 KB); twice that for 16 warps.
constexpr int kSmemPer8Warps = 72 * 1024;
constexpr int kWsFloats = 4 << 20;       // split-K workspace (16 MB)
constexpr int kMaxUnits = 1 << 16;       // per-warp arrival counters
__device__ float4 g_ws[kWsFloats / 4];   // zero between launches
__device__ unsigned g_count[kMaxUnits];  // zero between launches
constexpr int kStreamKAuto = -1;         // set_batch_stream_config (-2: the K-chunk grid)
int g_mt = 0, g_ks = 0, g_warps = 0, g_streamk = kStreamKAuto, g_sms = 0, g_optin = 0;

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes));
}

// Which K pieces a block runs. Split mode (streamk == 0): block (x, y) runs column blocks
// [y per, (y + 1) per) of tile group x, gridDim.y pieces per group. Stream-K mode: the
// groups x kblocks (group, column block) pairs, group-major, are cut into gridDim.x equal
// ranges, so every block gets the same work in one wave; a range may end one group and start
// the next, and a group's pieces are the blocks whose ranges meet it.
struct Range {
  int64_t begin, end;  // flattened group * kblocks + column block
};
__device__ __forceinline__ int64_t block_of(int64_t f, int64_t total) {
  return ((f + 1) * gridDim.x - 1) / total;  // the block whose stream-K range holds f
}

template <int BITS, int S, int W, int MT, int NT, bool G32, bool ASYM>
__global__ void __launch_bounds__(W * 32, W == 8 && MT * NT <= 8 ? 2 : 1)
    bstream_kernel(Params p, int per, int streamk) {
  using Pc = BatchPiece<BITS, S>;
  using SlotT = BatchSlot<BITS, S, MT, G32, ASYM>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __half* xs = reinterpret_cast<__half*>(smem_raw);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int groups = ((p.tiles + MT - 1) / MT + W - 1) / W;
  const int units = p.kblocks / Pc::kU;
  const int64_t total = int64_t{groups} * units;
  Range r;
  if (streamk) {
    r.begin = int64_t{blockIdx.x} * total / gridDim.x;
    r.end = int64_t{blockIdx.x + 1} * total / gridDim.x;
  } else {
    r.begin = int64_t{blockIdx.x} * units + min(units, static_cast<int>(blockIdx.y) * per);
    r.end = int64_t{blockIdx.x} * units + min(units, static_cast<int>(blockIdx.y + 1) * per);
  }
  bool first = true;

  for (int64_t f = r.begin; f < r.end;) {
    const int grp = static_cast<int>(f / units);
    const int u0 = static_cast<int>(f % units);
    const int u1 = static_cast<int>(min(int64_t{units}, u0 + (r.end - f)));
    f += u1 - u0;
    const int pieces = streamk ? static_cast<int>(block_of(int64_t{grp + 1} * units - 1, total) -
                                                  block_of(int64_t{grp} * units, total) + 1)
                               : static_cast<int>(gridDim.y);
    const int unit = grp * W + warp;  // this warp's MT tiles
    const int tile0 = unit * MT;
    const bool active = tile0 < p.tiles;  // surplus warps only help stage x
    int tiles[MT];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) tiles[mt] = min(tile0 + mt, p.tiles - 1);
    const int nb = active ? u1 - u0 : 0;

    auto fetch = [&](int u, SlotT& d) {
      batch_fetch<BITS, S, MT, G32, ASYM>(p, tiles, u, lane, g, d);
    };

    SlotT ring[Pc::kDepth];
#pragma unroll
    for (int u = 0; u < Pc::kDepth; ++u)
      if (u < nb) fetch(u0 + u, ring[u]);

    if (first) {
      // PDL (launch.h): the first weight loads overlap the previous kernel's tail; x (its
      // output), the workspace and the outputs wait for its completion.
      cuda::pdl_begin();
      first = false;
    } else {
      __syncthreads();  // every warp is done with the previous piece's x
    }

    // Stage x [8 NT][columns of this range]: whole 8-column pieces, zeros past n and cols.
    const int stride = (u1 - u0) * Pc::kCols + Pc::kPad, chunks = (u1 - u0) * Pc::kCols / 8;
    for (int i = threadIdx.x; i < 8 * NT * chunks; i += W * 32) {
      const int row = i / chunks, c = Pc::kCols * u0 + 8 * (i % chunks);
      __half* dst = xs + row * stride + 8 * (i % chunks);
      const bool in = row < p.n && c < p.cols;
      const __half* src = p.x + int64_t{in ? row : 0} * p.cols;
      if (p.perm == nullptr) {
        cp_async16(dst, src + (in ? c : 0), in ? 16 : 0);
      } else {
        __half h[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) h[k] = in ? src[__ldg(p.perm + c + k)] : __float2half_rn(0.f);
        memcpy(dst, h, 16);
      }
    }
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
    __syncthreads();

    float acc[MT * NT * 4];
#pragma unroll
    for (int i = 0; i < MT * NT * 4; ++i) acc[i] = 0.f;

    auto compute = [&](const SlotT& d, int i) {
      if constexpr (Pc::kTrellis)
        batch_compute_trellis<BITS, MT, NT>(acc, d, xs, stride, i, g, t);
      else
        batch_compute_scalar<BITS, S, MT, NT, G32, ASYM>(acc, d, xs, stride, i, g, t);
    };

    for (int i0 = 0; i0 < nb; i0 += Pc::kDepth) {
#pragma unroll
      for (int u = 0; u < Pc::kDepth; ++u) {
        const int i = i0 + u;
        if (i < nb) {
          compute(ring[u], i);
          if (i + Pc::kDepth < nb) fetch(u0 + i + Pc::kDepth, ring[u]);
        }
      }
    }
    if (!active) continue;

    bool store = true;
    if (pieces > 1) {
      // Fragment order in the workspace: (tile, token tile) -> 32 lanes x 4 floats.
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if (tile0 + mt >= p.tiles) break;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const float* c = &acc[(mt * NT + nt) * 4];
          atomicAdd(&g_ws[(int64_t{tile0 + mt} * NT + nt) * 32 + lane],
                    make_float4(c[0], c[1], c[2], c[3]));
        }
      }
      __threadfence();
      __syncwarp();
      unsigned arrived = 0;
      if (lane == 0) arrived = atomicAdd(&g_count[unit], 1u);
      arrived = __shfl_sync(0xffffffffu, arrived, 0);
      store = arrived == static_cast<unsigned>(pieces - 1);  // the last piece stores
      if (store) {
        __threadfence();
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if (tile0 + mt >= p.tiles) break;
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            float4* w = &g_ws[(int64_t{tile0 + mt} * NT + nt) * 32 + lane];
            const float4 v = __ldcg(w);
            __stcg(w, make_float4(0.f, 0.f, 0.f, 0.f));
            float* c = &acc[(mt * NT + nt) * 4];
            c[0] = v.x;
            c[1] = v.y;
            c[2] = v.z;
            c[3] = v.w;
          }
        }
        if (lane == 0) g_count[unit] = 0;
      }
    }
    if (!store) continue;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int tile = tile0 + mt;
      if (tile >= p.tiles) break;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float* c = &acc[(mt * NT + nt) * 4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int tok = 8 * nt + 2 * t + (i % 2);
          if (tok < p.n)
            store_batch_element(p, tile, g, i, tok, c[i], [&] { return c[(2 + i) & 3]; });
        }
      }
    }
  }
}

// Column blocks per chunk that fit the shared-memory budget at 8 NT tokens.
int max_per(int warps, int nt) {
  return (kSmemPer8Warps * (warps / 8) / (8 * nt * 2) - kXPad) / 64;
}

struct Plan {
  int warps = 0, mt = 0, nt = 0, ks = 0, per = 0, units = 0, groups = 0, streamk = 0;
  bool ok = false;
};

// Whether an instantiation reads these weights: 4-bit ones; tiled 2/3/5/6/8-bit ones in the
// in-place arrangement at the default blocks per piece; trellis-coded ones (pieces_s =
// kBatchTrellis) with groups of a power of two; f16 scales, no fused norm or rotation for both.
bool instantiated(const Params& p, int pieces_s) {
  const bool plain = !p.scale_f32 && p.norm_w == nullptr && p.had_block == 0;
  if (pieces_s == kBatchTrellis)
    return plain && !p.asym && (1 << p.group_log2) == p.group && p.group >= kTrellisTileDim &&
           (p.bits == 2 || p.bits == 3 || p.bits == 4 || p.bits == 5 || p.bits == 6 || p.bits == 8);
  if (p.bits == 4) return pieces_s == 1;
  return (p.bits == 2 || p.bits == 3 || p.bits == 5 || p.bits == 6 || p.bits == 8) && p.inplace &&
         pieces_s == narrow_default_pieces(p.bits, p.asym) && plain;
}

// The launch plan: forced knobs where set, else the choices measured best on H100 (round 6 of
// bench/qlinear_notes.md): 16-warp blocks; two tiles per warp up to 32 tokens on weights of
// >= 57344 (tile, column block) pairs (4096x14336, 14336x4096 and larger), else one; a stream-K
// wave, except where the tile groups alone fill the GPU (the LM head): there the K-chunk grid
// with the fewest chunks that fit shared memory. The narrow widths: 16 warps of one tile each
// (only those are instantiated); ranges in units of batch_unit_blocks.
Plan plan(const Params& p, int pieces_s) {
  Plan pl;
  const bool narrow = p.bits != 4 || pieces_s != 1;  // 2/3/5/6 bits, or trellis
  pl.nt = p.n <= 16 ? 2 : p.n <= 32 ? 4 : 8;
  pl.warps = g_warps != 0 && !narrow ? g_warps : 16;
  pl.mt = narrow                                                ? 1
          : g_mt != 0                                           ? g_mt
          : pl.nt <= 4 && int64_t{p.tiles} * p.kblocks >= 57344 ? 2
                                                                : 1;
  pl.units = (p.tiles + pl.mt - 1) / pl.mt;
  pl.groups = (pl.units + pl.warps - 1) / pl.warps;
  const int unit_blocks = batch_unit_blocks(p.bits, pieces_s);  // BatchPiece::kU
  const int units = p.kblocks / unit_blocks;                    // column units per tile row
  const int per_max = max_per(pl.warps, pl.nt) / unit_blocks;
  if (!instantiated(p, pieces_s) || per_max < 1 || p.n < 1 || p.n > 64 ||
      p.kblocks % unit_blocks != 0)
    return pl;
  const bool automatic = g_streamk == kStreamKAuto;
  if (g_streamk >= 0 || (automatic && pl.groups < g_sms)) {
    // Stream-K: g_streamk blocks (0 = one per SM, or two for 8-warp blocks), at least enough for
    // every block's columns to fit shared memory, at most one per (group, unit).
    const int64_t total = int64_t{pl.groups} * units;
    int64_t blocks = g_streamk > 0 ? g_streamk : g_sms * (pl.warps == 8 ? 2 : 1);
    blocks = std::max(blocks, (total + per_max - 1) / per_max);
    blocks = std::min(blocks, total);
    pl.streamk = 1;
    pl.ks = static_cast<int>(blocks);
    pl.per = static_cast<int>((total + blocks - 1) / blocks);
  } else {
    const int ks_min = (units + per_max - 1) / per_max;
    int ks = std::max(g_ks, ks_min);
    if (g_ks == 0 && !automatic) {
      // Fill about 16 resident warps per SM, keeping >= 8 column blocks per chunk.
      while (pl.groups * ks * pl.warps < 16 * g_sms && p.kblocks >= 8 * (ks + 1)) ++ks;
    }
    pl.per = (units + ks - 1) / ks;
    pl.ks = (units + pl.per - 1) / pl.per;  // no empty chunk
  }
  // Stream-K may split any group; the K-chunk grid only with more than one chunk.
  const bool split = pl.streamk || pl.ks > 1;
  pl.ok = !split || (int64_t{pl.units} * pl.mt * pl.nt * 128 <= kWsFloats && pl.units <= kMaxUnits);
  return pl;
}

void init_device() {
  if (g_sms != 0) return;
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev),
             "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&g_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
             "cudaDeviceGetAttribute");
}

// Raises the shared-memory limit of one kernel, and of the G32 and other-group kernels of one
// configuration.
template <int BITS, int S, int W, int MT, int NT, bool G32, bool ASYM>
void raise_one() {
  check_cuda(
      cudaFuncSetAttribute(bstream_kernel<BITS, S, W, MT, NT, G32, ASYM>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemPer8Warps * (W / 8)),
      "cudaFuncSetAttribute (qlinear bstream)");
}
template <int BITS, int S, int W, int MT, int NT, bool ASYM>
void raise_smem_limit() {
  raise_one<BITS, S, W, MT, NT, true, ASYM>();
  raise_one<BITS, S, W, MT, NT, false, ASYM>();
}

template <int K>
void raise_smem_limits_trellis() {
  raise_one<K, kBatchTrellis, 16, 1, 2, false, false>();
  raise_one<K, kBatchTrellis, 16, 1, 4, false, false>();
  raise_one<K, kBatchTrellis, 16, 1, 8, false, false>();
}

template <int W, int MT>
void raise_smem_limits4() {
  raise_smem_limit<4, 1, W, MT, 2, true>();
  raise_smem_limit<4, 1, W, MT, 2, false>();
  raise_smem_limit<4, 1, W, MT, 4, true>();
  raise_smem_limit<4, 1, W, MT, 4, false>();
  raise_smem_limit<4, 1, W, MT, 8, true>();
  raise_smem_limit<4, 1, W, MT, 8, false>();
}

template <int BITS, int NT>
void raise_smem_limits_narrow() {
  raise_smem_limit<BITS, narrow_default_pieces(BITS, true), 16, 1, NT, true>();
  raise_smem_limit<BITS, narrow_default_pieces(BITS, false), 16, 1, NT, false>();
}

template <int BITS>
void raise_smem_limits_narrow() {
  raise_smem_limits_narrow<BITS, 2>();
  raise_smem_limits_narrow<BITS, 4>();
  raise_smem_limits_narrow<BITS, 8>();
}

template <int BITS, int S, int W, int MT, int NT, bool G32, bool ASYM>
void launch_k(const Params& p, const Plan& pl, cudaStream_t stream) {
  // Stream-K: a block's range may span two groups, each piece staged on its own (<= per).
  const int smem = 8 * NT * (pl.per * BatchPiece<BITS, S>::kCols + BatchPiece<BITS, S>::kPad) * 2;
  const dim3 grid = pl.streamk ? dim3(pl.ks) : dim3(pl.groups, pl.ks);
  qlaunch(bstream_kernel<BITS, S, W, MT, NT, G32, ASYM>, grid, W * 32, static_cast<size_t>(smem),
          stream, p, pl.per, pl.streamk);
}

// The group (32 or larger) and symmetry of the weights; narrow widths at their default pieces.
template <int BITS, int W, int MT, int NT>
void launch_nt(const Params& p, const Plan& pl, cudaStream_t stream) {
  constexpr int kSa = BITS == 4 ? 1 : narrow_default_pieces(BITS, true);
  constexpr int kSs = BITS == 4 ? 1 : narrow_default_pieces(BITS, false);
  const bool g32 = p.group == 32;
  if (p.asym) {
    if (g32) return launch_k<BITS, kSa, W, MT, NT, true, true>(p, pl, stream);
    return launch_k<BITS, kSa, W, MT, NT, false, true>(p, pl, stream);
  }
  if (g32) return launch_k<BITS, kSs, W, MT, NT, true, false>(p, pl, stream);
  return launch_k<BITS, kSs, W, MT, NT, false, false>(p, pl, stream);
}

template <int K>
void launch_trellis(const Params& p, const Plan& pl, cudaStream_t stream) {
  if (pl.nt == 2) return launch_k<K, kBatchTrellis, 16, 1, 2, false, false>(p, pl, stream);
  if (pl.nt == 4) return launch_k<K, kBatchTrellis, 16, 1, 4, false, false>(p, pl, stream);
  return launch_k<K, kBatchTrellis, 16, 1, 8, false, false>(p, pl, stream);
}

template <int BITS, int W, int MT>
void launch_mt(const Params& p, const Plan& pl, cudaStream_t stream) {
  if (pl.nt == 2) return launch_nt<BITS, W, MT, 2>(p, pl, stream);
  if (pl.nt == 4) return launch_nt<BITS, W, MT, 4>(p, pl, stream);
  return launch_nt<BITS, W, MT, 8>(p, pl, stream);
}

}  // namespace

bool batch_stream_supported(const Params& p, int pieces_s) {
  init_device();
  return plan(p, pieces_s).ok;
}

// Where the stream batch kernel measured faster than the round-5 dispatch on H100
// (bench/qlinear_notes.md, round 6): 4-bit, 9..64 tokens, >= 128 tiles (2048 rows; 1024x4096
// kept the round-5 kernels), and at 33..64 tokens only up to 384 tiles (6144 rows): gate/up,
// 14336x4096 and the LM head measured faster on the round-5 kernels there.
bool batch_stream_preferred(const Params& p) {
  if (p.bits != 4 || p.n < 9 || p.n > 64 || p.tiles < 128 || (p.n > 32 && p.tiles > 384))
    return false;
  return batch_stream_supported(p, 1);
}

void launch_batch_stream(const Params& p, cudaStream_t stream, int pieces_s) {
  init_device();
  prepare_batch_stream();
  const Plan pl = plan(p, pieces_s);
  GYRE_CHECK(pl.ok, "qlinear bstream: no launch plan for ", p.bits, "-bit [", p.rows, ", ", p.cols,
             "] at ", p.n, " rows");
  if (pieces_s == kBatchTrellis) {
    switch (p.bits) {
      case 2:
        return launch_trellis<2>(p, pl, stream);
      case 3:
        return launch_trellis<3>(p, pl, stream);
      case 4:
        return launch_trellis<4>(p, pl, stream);
      case 5:
        return launch_trellis<5>(p, pl, stream);
      case 6:
        return launch_trellis<6>(p, pl, stream);
      default:
        return launch_trellis<8>(p, pl, stream);
    }
  }
  switch (p.bits) {
    case 2:
      return launch_mt<2, 16, 1>(p, pl, stream);
    case 3:
      return launch_mt<3, 16, 1>(p, pl, stream);
    case 5:
      return launch_mt<5, 16, 1>(p, pl, stream);
    case 6:
      return launch_mt<6, 16, 1>(p, pl, stream);
    case 8:
      return launch_mt<8, 16, 1>(p, pl, stream);
    default:
      break;
  }
  if (pl.warps == 16) {
    if (pl.mt == 1) return launch_mt<4, 16, 1>(p, pl, stream);
    return launch_mt<4, 16, 2>(p, pl, stream);
  }
  if (pl.mt == 1) return launch_mt<4, 8, 1>(p, pl, stream);
  return launch_mt<4, 8, 2>(p, pl, stream);
}

// Raises the shared-memory limit of every instantiation once per device; called at 4-bit and
// tiled narrow weight upload too, so that it never first happens inside a graph capture.
void prepare_batch_stream() {
  static uint64_t done_devices = 0;
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  const uint64_t bit = dev < 64 ? uint64_t{1} << dev : 0;
  if (bit != 0 && (done_devices & bit) != 0) return;
  raise_smem_limits4<8, 1>();
  raise_smem_limits4<8, 2>();
  raise_smem_limits4<16, 1>();
  raise_smem_limits4<16, 2>();
  raise_smem_limits_narrow<2>();
  raise_smem_limits_narrow<3>();
  raise_smem_limits_narrow<5>();
  raise_smem_limits_narrow<6>();
  raise_smem_limits_narrow<8>();
  raise_smem_limits_trellis<2>();
  raise_smem_limits_trellis<3>();
  raise_smem_limits_trellis<4>();
  raise_smem_limits_trellis<5>();
  raise_smem_limits_trellis<6>();
  raise_smem_limits_trellis<8>();
  done_devices |= bit;
}

void set_batch_stream_config(int tiles_per_warp, int ksplit, int warps, int streamk_blocks) {
  g_mt = tiles_per_warp;
  g_ks = ksplit;
  g_warps = warps;
  g_streamk = streamk_blocks;
}

}  // namespace gyre::qlinear_detail
