// The 4-bit decode GEMV (n = 1..8, tiled layout of qlinear_tiled.cu) as a register pipeline:
// every warp keeps D column blocks (512 bytes each, with their scales) in flight at all times
// and refills a slot as soon as it has consumed it, while x sits in shared memory, staged once
// per thread block (gathered through the act-order permutation there).
//
// Why: round 4 (bench/qlinear_notes.md) found each warp of the earlier kernels advancing one
// block per ~0.6 us whatever the weight prefetch depth: the batch-then-wait loop of the
// register-fed kernel waits a full DRAM round trip per batch, and the shared-memory rings waited
// on x loads from global memory (L2 under full load) for every stage. Here nothing global sits
// on the per-block chain: weights and scales were requested D blocks earlier, x is in shared
// memory.
//
// Work split as in the register-fed kernel: a block holds (warps / ksplit) 16-row tiles x ksplit
// warps; warp k of a tile takes the contiguous column-block range [k * per, (k + 1) * per); the
// ksplit partial sums meet in shared memory; same epilogue (bias, split outputs, SwiGLU).
// Handles f16 scales only (f32-scale repacks stay on the register-fed kernel).
#include <algorithm>

#include "backend/cuda/qlinear_kernels.cuh"

namespace gyre::qlinear_detail {

void check_cuda(cudaError_t e, const char* what);  // qlinear.cu

namespace {

constexpr int kXPad = 32;  // halves after each staged x row: rows 64 bytes apart mod 128 banks

template <bool G32, bool ASYM>
struct Slot {
  uint4 q;
  uint32_t s[G32 ? 2 : 1];
  uint32_t m[ASYM ? (G32 ? 2 : 1) : 1];
};

template <int D, bool G32, bool ASYM>
__global__ void __launch_bounds__(512) gemv4_stream_kernel(Params p, int per) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __half* xs = reinterpret_cast<__half*>(smem_raw);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x * (blockDim.x / 32 / p.ksplit) + warp / p.ksplit;
  const int ks = warp % p.ksplit;
  const int tile_c = min(tile, p.tiles - 1);  // surplus warps compute a copy, store nothing
  const int b_begin = min(ks * per, p.kblocks), b_end = min(b_begin + per, p.kblocks);
  const int nb = b_end - b_begin;
  const uint8_t* wbase = p.qweight + (int64_t{tile_c} * p.kblocks * 32 + lane) * 16;
  const unsigned int* sbase = reinterpret_cast<const unsigned int*>(
      static_cast<const __half*>(p.scales) + int64_t{tile_c} * p.groups_p * 16 + 2 * g);
  const unsigned int* mbase =
      ASYM ? reinterpret_cast<const unsigned int*>(static_cast<const __half*>(p.mins) +
                                                   int64_t{tile_c} * p.groups_p * 16 + 2 * g)
           : nullptr;

  auto fetch = [&](int b, Slot<G32, ASYM>& d) {
    d.q = load_stream(wbase + int64_t{b} * 512);
    const int gi = G32 ? 2 * b : (64 * b) >> p.group_log2;
#pragma unroll
    for (int k = 0; k < (G32 ? 2 : 1); ++k) {
      d.s[k] = __ldg(sbase + (gi + k) * 8);
      if constexpr (ASYM) d.m[k] = __ldg(mbase + (gi + k) * 8);
    }
  };

  Slot<G32, ASYM> ring[D];
#pragma unroll
  for (int u = 0; u < D; ++u)
    if (u < nb) fetch(b_begin + u, ring[u]);

  // PDL (launch.h): the weight loads above overlap the previous kernel's tail; x (its output) and
  // everything written below wait for its completion.
  cuda::pdl_begin();

  // Stage x (rows 0..n-1, columns padded to whole blocks with zeros) while the weights travel,
  // then (norm_w set) scale each row by its RMS norm exactly as the rmsnorm kernel rounds it.
  const int xcols = p.kblocks * 64, stride = xcols + kXPad, chunks = xcols / 8;
  __shared__ float norm_sum[8];
  if (p.norm_w != nullptr && threadIdx.x < 8) norm_sum[threadIdx.x] = 0.f;
  if (p.norm_w != nullptr) __syncthreads();
  for (int tok = 0; tok < p.n; ++tok) {
    const __half* row = p.x + int64_t{tok} * p.cols;
    float ss = 0.f;
    for (int i = threadIdx.x; i < chunks; i += blockDim.x) {
      const int c = i * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (p.perm == nullptr && c + 8 <= p.cols) {
        v = __ldg(reinterpret_cast<const uint4*>(row + c));
      } else if (c < p.cols) {
        __half h[8];
        for (int k = 0; k < 8; ++k) {
          const int cc = c + k;
          h[k] = cc < p.cols ? row[p.perm ? __ldg(p.perm + cc) : cc] : __float2half(0.f);
        }
        memcpy(&v, h, 16);
      }
      if (p.norm_w != nullptr) {
        const uint32_t w4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float2 f = __half22float2(as_half2(w4[k]));
          ss += f.x * f.x + f.y * f.y;
        }
      }
      *reinterpret_cast<uint4*>(xs + tok * stride + c) = v;
    }
    if (p.norm_w != nullptr) {
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (lane == 0) atomicAdd(&norm_sum[tok], ss);
    }
  }
  __syncthreads();
  if (p.norm_w != nullptr) {
    for (int tok = 0; tok < p.n; ++tok) {
      const float inv_rms = rsqrtf(norm_sum[tok] / static_cast<float>(p.cols) + p.norm_eps);
      for (int i = threadIdx.x; i < chunks; i += blockDim.x) {
        const int c = i * 8;
        if (c >= p.cols) continue;
        __half h[8];
        memcpy(h, xs + tok * stride + c, 16);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const int cc = c + k;
          if (cc < p.cols) {
            const float w = __half2float(p.norm_w[p.perm ? __ldg(p.perm + cc) : cc]);
            h[k] = __float2half(__half2float(h[k]) * inv_rms * w);
          }
        }
        memcpy(xs + tok * stride + c, h, 16);
      }
    }
    __syncthreads();
  }

  const __half* xrow = xs + min(g, p.n - 1) * stride + 8 * t;  // B column g: token g
  const __half2 lo_base = __float2half2_rn(ASYM ? 1024.f : 1032.f);
  const __half2 hi_base = __float2half2_rn(ASYM ? -64.f : -72.f);
  const uint32_t ones[4] = {0x3C003C00u, 0x3C003C00u, 0x3C003C00u, 0x3C003C00u};
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  float cg[4] = {0.f, 0.f, 0.f, 0.f}, cx[4] = {0.f, 0.f, 0.f, 0.f};
  auto flush = [&](uint32_t sr, uint32_t mr) {
    const float2 m = ASYM ? __half22float2(as_half2(mr)) : make_float2(0.f, 0.f);
    flush_group(acc, cg, cx, __half22float2(as_half2(sr)), m, ASYM);
  };
  auto compute = [&](const Slot<G32, ASYM>& d, int b) {
    const uint4 x0 = *reinterpret_cast<const uint4*>(xrow + 64 * b);
    const uint4 x1 = *reinterpret_cast<const uint4*>(xrow + 64 * b + 32);
    const uint32_t words[4] = {d.q.x, d.q.y, d.q.z, d.q.w};
    const uint32_t xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t a[4];
      int4_word_to_fragment(words[j], lo_base, hi_base, a);
      mma_16816(cg, a, xv[2 * j], xv[2 * j + 1]);
      if constexpr (ASYM) mma_16816(cx, ones, xv[2 * j], xv[2 * j + 1]);
      if (G32 && j == 1) flush(d.s[0], ASYM ? d.m[0] : 0u);
    }
    if constexpr (G32) {
      flush(d.s[1], ASYM ? d.m[ASYM ? 1 : 0] : 0u);
    } else {
      // A group spans 2+ blocks: flush when the next block starts a new group (or at the end).
      const int b1 = b + 1;
      if (b1 == b_end || ((64 * b1) & ((1 << p.group_log2) - 1)) == 0)
        flush(d.s[0], ASYM ? d.m[0] : 0u);
    }
  };

  for (int i0 = 0; i0 < nb; i0 += D) {
#pragma unroll
    for (int u = 0; u < D; ++u) {
      const int i = i0 + u;
      if (i < nb) {
        compute(ring[u], b_begin + i);
        if (i + D < nb) fetch(b_begin + i + D, ring[u]);
      }
    }
  }

  __shared__ float4 partial[16][32];
  reduce_store_gemv_tile(p, partial, warp, ks, tile, acc);
}

int g_depth = 0, g_sms = 0, g_smem_optin = 0;

template <int D, bool G32, bool ASYM>
void launch_d(const Params& q, int per, unsigned blocks, unsigned threads, int smem,
              cudaStream_t stream) {
  auto kernel = gemv4_stream_kernel<D, G32, ASYM>;
  // Once per instantiation: allow the largest dynamic size next to the static reduction space
  // (the 48 KB default counts static and dynamic shared memory together).
  static bool raised = false;
  if (!raised) {
    cudaFuncAttributes attr{};
    check_cuda(cudaFuncGetAttributes(&attr, kernel), "cudaFuncGetAttributes (gemv4 stream)");
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    g_smem_optin - static_cast<int>(attr.sharedSizeBytes)),
               "cudaFuncSetAttribute (gemv4 stream)");
    raised = true;
  }
  qlaunch(kernel, blocks, threads, static_cast<size_t>(smem), stream, q, per);
}

template <int D>
void launch_depth(const Params& q, int per, unsigned blocks, unsigned threads, int smem,
                  cudaStream_t stream) {
  const bool g32 = q.group == 32;
  if (q.asym) {
    if (g32) return launch_d<D, true, true>(q, per, blocks, threads, smem, stream);
    return launch_d<D, false, true>(q, per, blocks, threads, smem, stream);
  }
  if (g32) return launch_d<D, true, false>(q, per, blocks, threads, smem, stream);
  return launch_d<D, false, false>(q, per, blocks, threads, smem, stream);
}

int stream_smem(const Params& p) {
  return p.n * (p.kblocks * 64 + kXPad) * 2;
}

}  // namespace

bool gemv4_stream_supported(const Params& p) {
  if (g_sms == 0) {
    int dev = 0;
    check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&g_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
               "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev),
               "cudaDeviceGetAttribute");
  }
  // x for all n tokens must leave room for 3 blocks per SM (a third of the opt-in maximum).
  return !p.scale_f32 && p.n >= 1 && p.n <= 8 && stream_smem(p) <= (g_smem_optin - 8 * 1024) / 3;
}

void launch_gemv4_stream(const Params& p, int ksplit, cudaStream_t stream) {
  Params q = p;
  int ks = ksplit;
  if (ks == 0) {
    // One resident wave of 64-register warps (32 per SM): the largest split-K that keeps
    // tiles x ksplit within it (measured best on every Llama shape, round 5).
    ks = 1;
    while (ks < 16 && q.tiles * ks * 2 <= g_sms * 32 && q.kblocks >= 2 * ks) ks *= 2;
  }
  q.ksplit = ks;
  const int per = (q.kblocks + ks - 1) / ks;
  const int warps = std::max(8, ks), tiles_per_block = warps / ks;
  const unsigned blocks = static_cast<unsigned>((q.tiles + tiles_per_block - 1) / tiles_per_block);
  const unsigned threads = warps * 32;
  const int smem = stream_smem(q);
  if (g_depth == 8) return launch_depth<8>(q, per, blocks, threads, smem, stream);
  if (g_depth == 16) return launch_depth<16>(q, per, blocks, threads, smem, stream);
  return launch_depth<4>(q, per, blocks, threads, smem, stream);
}

void set_gemv_depth(int depth) {
  g_depth = depth;
}

}  // namespace gyre::qlinear_detail
