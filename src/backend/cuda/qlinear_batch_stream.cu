// 4-bit serving-batch matmul (n = 9..64) built like the stream GEMV (qlinear_gemv_stream.cu):
// x staged once per thread block in shared memory, every warp keeping D column blocks of weights
// (and their scales) in flight in a register ring, the first D requested before the PDL wait;
// the math of the tensor-core batch kernels (dequantized A fragments from registers, x as B
// from shared memory, mma.m16n8k16 with float accumulators, mma_scaled_step).
//
// Why (bench/qlinear_notes.md, rounds 4 and 5): every earlier batch kernel streams only
// ~10-16 GB/s per thread block, too few bytes in flight per SM; the register ring fixed that for
// the n = 1 GEMV. Here it is applied to 9..64 tokens.
//
// Work split: block (x, y) owns tile group x (kWarps warps x MT 16-row tiles) and the y-th
// K-chunk of `per` 64-column blocks; x [8 NT tokens][per * 64 columns] is staged for that chunk
// (its size bounds `per`). With one chunk (ks = 1) each warp stores its tiles directly.
// Otherwise the chunks' partial fragments meet in a global float workspace by vector atomics
// (red.global.add.v4.f32) in fragment order, and the warp that arrives last for its tiles (a
// per-warp counter) reads the sums, clears the workspace and counter for the next launch, and
// runs the same epilogue (bias, split outputs, SwiGLU, accumulate). The workspace is a fixed
// __device__ array: no allocation (graph capture) and no memset; kernels of this family on one
// stream never overlap in their post-wait parts (PDL waits for the previous grid's completion).
#include <algorithm>

#include "backend/cuda/qlinear_kernels.cuh"

namespace gyre::qlinear_detail {

void check_cuda(cudaError_t e, const char* what);  // qlinear.cu
void prepare_batch_stream();

namespace {

constexpr int kWarps = 8;
constexpr int kDepth = 4;                // column blocks in flight per warp (round 5: D = 4)
constexpr int kXPad = 32;                // halves after each x row: rows 64 bytes apart mod 128
constexpr int kSmemBudget = 72 * 1024;   // x per block: three blocks fit in an SM's 227 KB
constexpr int kWsFloats = 4 << 20;       // split-K workspace (16 MB)
constexpr int kMaxUnits = 1 << 16;       // per-warp arrival counters
__device__ float4 g_ws[kWsFloats / 4];   // zero between launches
__device__ unsigned g_count[kMaxUnits];  // zero between launches
int g_mt = 0, g_ks = 0, g_sms = 0, g_optin = 0;

template <int MT, bool G32, bool ASYM>
struct Slot {
  uint4 q[MT];
  uint32_t s[MT][G32 ? 2 : 1];               // f16 (row g, row g + 8) per group half
  uint32_t m[MT][ASYM ? (G32 ? 2 : 1) : 1];  // same for the mins (unused when symmetric)
};

__device__ __forceinline__ uint32_t scale_pair(const void* base, bool f32, int64_t idx) {
  if (f32) {
    const float2 v = __ldg(reinterpret_cast<const float2*>(static_cast<const float*>(base) + idx));
    const __half2 h = __floats2half2_rn(v.x, v.y);
    uint32_t r;
    memcpy(&r, &h, 4);
    return r;
  }
  return __ldg(reinterpret_cast<const unsigned int*>(static_cast<const __half*>(base) + idx));
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes));
}

template <int MT, int NT, bool G32, bool ASYM>
__global__ void __launch_bounds__(kWarps * 32, MT* NT <= 8 ? 2 : 1)
    bstream_kernel(Params p, int per) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __half* xs = reinterpret_cast<__half*>(smem_raw);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int unit = blockIdx.x * kWarps + warp;  // this warp's MT tiles
  const int tile0 = unit * MT;
  const bool active = tile0 < p.tiles;  // surplus warps only help stage x
  int tiles[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) tiles[mt] = min(tile0 + mt, p.tiles - 1);
  const int kb0 = min(p.kblocks, static_cast<int>(blockIdx.y) * per);
  const int nb = active ? min(p.kblocks, kb0 + per) - kb0 : 0;

  auto fetch = [&](int kb, Slot<MT, G32, ASYM>& d) {
    const int gi = G32 ? 2 * kb : (64 * kb) >> p.group_log2;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      d.q[mt] = load_stream(p.qweight + ((int64_t{tiles[mt]} * p.kblocks + kb) * 32 + lane) * 16);
#pragma unroll
      for (int k = 0; k < (G32 ? 2 : 1); ++k) {
        const int64_t idx = (int64_t{tiles[mt]} * p.groups_p + gi + k) * 16 + 2 * g;
        d.s[mt][k] = scale_pair(p.scales, p.scale_f32, idx);
        if constexpr (ASYM) d.m[mt][k] = scale_pair(p.mins, p.scale_f32, idx);
      }
    }
  };

  Slot<MT, G32, ASYM> ring[kDepth];
#pragma unroll
  for (int u = 0; u < kDepth; ++u)
    if (u < nb) fetch(kb0 + u, ring[u]);

  // PDL (launch.h): the weight loads above overlap the previous kernel's tail; x (its output),
  // the workspace and the outputs wait for its completion.
  cuda::pdl_begin();

  // Stage x [8 NT][per * 64] for this chunk: whole 8-column pieces, zeros past n and cols.
  const int stride = per * 64 + kXPad, pieces = per * 8;
  for (int i = threadIdx.x; i < 8 * NT * pieces; i += kWarps * 32) {
    const int r = i / pieces, c = 64 * kb0 + 8 * (i % pieces);
    __half* dst = xs + r * stride + 8 * (i % pieces);
    const bool in = r < p.n && c < p.cols;
    const __half* row = p.x + int64_t{in ? r : 0} * p.cols;
    if (p.perm == nullptr) {
      cp_async16(dst, row + (in ? c : 0), in ? 16 : 0);
    } else {
      __half h[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) h[k] = in ? row[__ldg(p.perm + c + k)] : __float2half_rn(0.f);
      memcpy(dst, h, 16);
    }
  }
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
  __syncthreads();

  const __half2 lo_base = __float2half2_rn(ASYM ? 1024.f : 1032.f);
  const __half2 hi_base = __float2half2_rn(ASYM ? -64.f : -72.f);
  float acc[MT * NT * 4];
#pragma unroll
  for (int i = 0; i < MT * NT * 4; ++i) acc[i] = 0.f;

  auto compute = [&](const Slot<MT, G32, ASYM>& d, int i) {
    const __half* xb = xs + g * stride + 64 * i + 8 * t;  // token 8 nt + g, lane's columns
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint4 x[NT];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        x[nt] = *reinterpret_cast<const uint4*>(xb + 8 * nt * stride + 32 * h);
      __half2 s_lo[MT], s_hi[MT], m_lo[MT], m_hi[MT];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const __half2 s = as_half2(d.s[mt][G32 ? h : 0]);
        s_lo[mt] = __low2half2(s);
        s_hi[mt] = __high2half2(s);
        m_lo[mt] = m_hi[mt] = __float2half2_rn(0.f);
        if constexpr (ASYM) {
          const __half2 m = as_half2(d.m[mt][G32 ? h : 0]);
          m_lo[mt] = __low2half2(m);
          m_hi[mt] = __high2half2(m);
        }
      }
#pragma unroll
      for (int jj = 0; jj < 2; ++jj)
        mma_scaled_step<MT, NT>(acc, d.q, 2 * h + jj, x, s_lo, s_hi, m_lo, m_hi, lo_base, hi_base);
    }
  };

  for (int i0 = 0; i0 < nb; i0 += kDepth) {
#pragma unroll
    for (int u = 0; u < kDepth; ++u) {
      const int i = i0 + u;
      if (i < nb) {
        compute(ring[u], i);
        if (i + kDepth < nb) fetch(kb0 + i + kDepth, ring[u]);
      }
    }
  }
  if (!active) return;

  if (gridDim.y > 1) {
    // Fragment order: (tile, token tile) -> 32 lanes x 4 floats.
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
    if (arrived != gridDim.y - 1) return;
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

// Column blocks per chunk that fit the shared-memory budget at 8 NT tokens.
int max_per(int nt) {
  return (kSmemBudget / (8 * nt * 2) - kXPad) / 64;
}

struct Plan {
  int mt = 0, nt = 0, ks = 0, per = 0, units = 0;
  bool ok = false;
};

Plan plan(const Params& p) {
  Plan pl;
  pl.nt = p.n <= 16 ? 2 : p.n <= 32 ? 4 : 8;
  pl.mt = g_mt != 0 ? g_mt : 2;
  pl.units = (p.tiles + pl.mt - 1) / pl.mt;
  const int groups = (pl.units + kWarps - 1) / kWarps;
  const int ks_min = (p.kblocks + max_per(pl.nt) - 1) / max_per(pl.nt);
  int ks = std::max(g_ks, ks_min);
  if (g_ks == 0) {
    // Fill about two resident blocks per SM, keeping >= 8 column blocks per chunk.
    while (groups * ks < 2 * g_sms && p.kblocks >= 8 * (ks + 1)) ++ks;
  }
  pl.per = (p.kblocks + ks - 1) / ks;
  pl.ks = (p.kblocks + pl.per - 1) / pl.per;  // no empty chunk
  pl.ok = p.bits == 4 && p.n >= 1 && p.n <= 64 &&
          (pl.ks == 1 ||
           (int64_t{pl.units} * pl.mt * pl.nt * 128 <= kWsFloats && pl.units <= kMaxUnits));
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

template <int MT, int NT>
void raise_smem_limit() {
  for (auto kernel : {bstream_kernel<MT, NT, true, true>, bstream_kernel<MT, NT, true, false>,
                      bstream_kernel<MT, NT, false, true>, bstream_kernel<MT, NT, false, false>})
    check_cuda(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBudget),
        "cudaFuncSetAttribute (qlinear bstream)");
}

template <int MT, int NT, bool G32, bool ASYM>
void launch_k(const Params& p, const Plan& pl, cudaStream_t stream) {
  const int smem = 8 * NT * (pl.per * 64 + kXPad) * 2;
  const dim3 grid((pl.units + kWarps - 1) / kWarps, pl.ks);
  qlaunch(bstream_kernel<MT, NT, G32, ASYM>, grid, kWarps * 32, static_cast<size_t>(smem), stream,
          p, pl.per);
}

template <int MT, int NT>
void launch_nt(const Params& p, const Plan& pl, cudaStream_t stream) {
  const bool g32 = p.group == 32;
  if (p.asym) {
    if (g32) return launch_k<MT, NT, true, true>(p, pl, stream);
    return launch_k<MT, NT, false, true>(p, pl, stream);
  }
  if (g32) return launch_k<MT, NT, true, false>(p, pl, stream);
  return launch_k<MT, NT, false, false>(p, pl, stream);
}

template <int MT>
void launch_mt(const Params& p, const Plan& pl, cudaStream_t stream) {
  if (pl.nt == 2) return launch_nt<MT, 2>(p, pl, stream);
  if (pl.nt == 4) return launch_nt<MT, 4>(p, pl, stream);
  return launch_nt<MT, 8>(p, pl, stream);
}

}  // namespace

bool batch_stream_supported(const Params& p) {
  init_device();
  return plan(p).ok;
}

// Measured on H100 (bench/qlinear_notes.md, round 6): where the stream batch kernel beats the
// earlier dispatch.
bool batch_stream_preferred(const Params& p) {
  return false && batch_stream_supported(p);
}

void launch_batch_stream(const Params& p, cudaStream_t stream) {
  init_device();
  prepare_batch_stream();
  const Plan pl = plan(p);
  if (pl.mt == 1) return launch_mt<1>(p, pl, stream);
  return launch_mt<2>(p, pl, stream);
}

// Raises the shared-memory limit of every instantiation once per device; called at 4-bit weight
// upload too, so that it never first happens inside a graph capture.
void prepare_batch_stream() {
  static uint64_t done_devices = 0;
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  const uint64_t bit = dev < 64 ? uint64_t{1} << dev : 0;
  if (bit != 0 && (done_devices & bit) != 0) return;
  raise_smem_limit<1, 2>();
  raise_smem_limit<1, 4>();
  raise_smem_limit<1, 8>();
  raise_smem_limit<2, 2>();
  raise_smem_limit<2, 4>();
  raise_smem_limit<2, 8>();
  done_devices |= bit;
}

void set_batch_stream_config(int tiles_per_warp, int ksplit) {
  g_mt = tiles_per_warp;
  g_ks = ksplit;
}

}  // namespace gyre::qlinear_detail
