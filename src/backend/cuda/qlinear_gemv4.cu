// An experimental 4-bit decode GEMV (n = 1..8) on tensor cores, fed through shared memory.
// Opt-in (qlinear_detail::set_gemv_kernel(2 or 3)): on H100 it measured 5-25% slower than the
// register-fed default (qlinear_tiled.cu) on every Llama shape (bench/qlinear_notes.md, round 4,
// with the analysis and the next experiment); kept, with its tests, as the base for that.
//
// Idea: the register-fed GEMV holds its bytes in flight in registers (~1 KB per warp), so it was
// thought bound by data in flight. Here each warp owns a ring of S stages in shared memory, each
// stage C consecutive 512-byte (tile, column block) pieces plus the stage's scales (and mins),
// filled either by lane 0 with cp.async.bulk completing on the stage's mbarrier (kernel 2) or by
// every lane with 16-byte cp.async, one commit group per stage (kernel 3); the slot refills as
// soon as it has been read, and no block-wide barrier sits in the loop.
//
// Work split: a block holds (warps / ksplit) 16-row tiles x ksplit warps; warp k of a tile takes
// the contiguous column-block range [k * kb_per, (k + 1) * kb_per) (contiguous in the tiled layout,
// so one copy per stage), and the ksplit partial sums meet in shared memory before the epilogue
// (bias, split outputs or SwiGLU), exactly as in the register-fed kernel.
#include <algorithm>

#include "backend/cuda/qlinear_kernels.cuh"
#include "core/error.h"

namespace gyre::qlinear_detail {

void check_cuda(cudaError_t e, const char* what);  // qlinear.cu

namespace {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void bar_init(uint32_t bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void bar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void bar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}

// Global -> shared bulk copy (bytes % 16 == 0, both addresses 16-byte aligned), completing on bar.
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}

__device__ __forceinline__ float2 lds_pair(uint32_t addr, bool f32) {
  if (f32) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr));
    return v;
  }
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
  return __half22float2(as_half2(v));
}

// Shared-memory bytes of one stage: C pieces, then the scales, then the mins, of at most
// 2C (group 32) or C (group >= 64) groups of 16 rows.
struct RingShape {
  int scale_slot, stage_bytes, warp_bytes;
};

RingShape ring_shape(const Params& p, int c, int s) {
  RingShape r{};
  const int groups = p.group == 32 ? 2 * c : c;
  r.scale_slot = groups * 16 * (p.scale_f32 ? 4 : 2);
  r.stage_bytes = c * 512 + r.scale_slot * (p.asym ? 2 : 1);
  r.warp_bytes = s * r.stage_bytes + (s * 8 + 15) / 16 * 16;  // stages, then the mbarriers
  return r;
}

// Per-lane cp.async (LDGSTS, through the load/store units like ordinary loads) of 16 bytes.
__device__ __forceinline__ void lane_copy16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

// LDGSTS selects the copy engine: false = one cp.async.bulk per stage by lane 0, completing on
// the stage's mbarrier (Hopper bulk copy); true = every lane copies its 16-byte piece of each
// block (and a share of the scales) with cp.async, one commit group per stage.
template <bool G32, int C, int S, bool LDGSTS>
__global__ void __launch_bounds__(512) gemv4_ring_kernel(Params p, int kb_per, RingShape rs) {
  extern __shared__ __align__(128) uint8_t ring_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x * (blockDim.x / 32 / p.ksplit) + warp / p.ksplit;
  const int kpart = warp % p.ksplit;
  const int b_begin = min(kpart * kb_per, p.kblocks);
  const int b_end = tile < p.tiles ? min(b_begin + kb_per, p.kblocks) : b_begin;
  const int stages = (b_end - b_begin + C - 1) / C;
  const int esize = p.scale_f32 ? 4 : 2;
  const uint32_t ring = smem_addr(ring_smem) + warp * rs.warp_bytes;
  const uint32_t bars = ring + S * rs.stage_bytes;
  const uint8_t* qtile = p.qweight + int64_t{min(tile, p.tiles - 1)} * p.kblocks * 512;
  const int64_t stile = int64_t{min(tile, p.tiles - 1)} * p.groups_p * 16;

  auto first_group = [&](int b) { return G32 ? 2 * b : (64 * b) >> p.group_log2; };
  // Lane 0: ask for stage st (C pieces from block b_begin + C st, their groups' scales / mins).
  auto issue = [&](int st) {
    const int b = b_begin + st * C, cnt = min(C, b_end - b);
    const uint32_t slot = ring + (st % S) * rs.stage_bytes, bar = bars + (st % S) * 8;
    const int gi0 = first_group(b),
              gi1 = G32 ? 2 * (b + cnt) - 1 : (64 * (b + cnt) - 1) >> p.group_log2;
    const uint32_t sbytes = (gi1 - gi0 + 1) * 16 * esize;
    const int64_t soff = (stile + int64_t{gi0} * 16) * esize;
    if constexpr (LDGSTS) {
      for (int j = 0; j < cnt; ++j)
        lane_copy16(slot + j * 512 + lane * 16, qtile + int64_t{b + j} * 512 + lane * 16);
      for (uint32_t o = lane * 16; o < sbytes; o += 512) {
        lane_copy16(slot + C * 512 + o, static_cast<const uint8_t*>(p.scales) + soff + o);
        if (p.asym)
          lane_copy16(slot + C * 512 + rs.scale_slot + o,
                      static_cast<const uint8_t*>(p.mins) + soff + o);
      }
      return;
    }
    bar_expect(bar, cnt * 512 + sbytes * (p.asym ? 2 : 1));
    bulk_copy(slot, qtile + int64_t{b} * 512, cnt * 512, bar);
    bulk_copy(slot + C * 512, static_cast<const uint8_t*>(p.scales) + soff, sbytes, bar);
    if (p.asym)
      bulk_copy(slot + C * 512 + rs.scale_slot, static_cast<const uint8_t*>(p.mins) + soff, sbytes,
                bar);
  };

  if constexpr (LDGSTS) {
    // One commit group per stage slot, empty past the last stage, so that "all but the newest
    // S - 1 groups complete" always means "stage st has landed".
    for (int st = 0; st < S; ++st) {
      if (st < stages) issue(st);
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
  } else if (lane == 0) {
    for (int s = 0; s < S; ++s) bar_init(bars + s * 8);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    for (int st = 0; st < min(S, stages); ++st) issue(st);
  }
  __syncwarp();

  const __half* xrow = p.x + int64_t{min(g, p.n - 1)} * p.cols;  // B column g: token g
  const __half2 lo_base = __float2half2_rn(p.asym ? 1024.f : 1032.f);
  const __half2 hi_base = __float2half2_rn(p.asym ? -64.f : -72.f);
  const uint32_t ones[4] = {0x3C003C00u, 0x3C003C00u, 0x3C003C00u, 0x3C003C00u};
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  // Rows g, g+8 x tokens 2t, 2t+1: acc += s * sum(q x) (+ m * sum(x)) for one group.
  auto flush = [&](float(&cg)[4], float(&cx)[4], uint32_t saddr) {
    const float2 s = lds_pair(saddr, p.scale_f32);
    acc[0] += s.x * cg[0];
    acc[1] += s.x * cg[1];
    acc[2] += s.y * cg[2];
    acc[3] += s.y * cg[3];
    if (p.asym) {
      const float2 m = lds_pair(saddr + rs.scale_slot, p.scale_f32);
      acc[0] += m.x * cx[0];
      acc[1] += m.x * cx[1];
      acc[2] += m.y * cx[2];
      acc[3] += m.y * cx[3];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) cg[i] = cx[i] = 0.f;
  };

  // x of stage st (token g, this lane's 16 columns of each block), clamped inside the range.
  auto load_x = [&](int st, uint4(&xv)[C][2]) {
    const int b = b_begin + st * C;
#pragma unroll
    for (int j = 0; j < C; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int c = 64 * max(min(b + j, b_end - 1), 0) + 32 * h + 8 * t;
        xv[j][h] = make_uint4(0, 0, 0, 0);
        if (c < p.cols) {
          if (p.perm == nullptr) {
            xv[j][h] = __ldg(reinterpret_cast<const uint4*>(xrow + c));
          } else {
            __half hx[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) hx[i] = xrow[__ldg(p.perm + c + i)];
            memcpy(&xv[j][h], hx, 16);
          }
        }
      }
    }
  };
  uint4 xnext[C][2];
  if (stages > 0) load_x(0, xnext);
  for (int st = 0; st < stages; ++st) {
    const int b = b_begin + st * C, cnt = min(C, b_end - b);
    // x one stage ahead: its L1/L2 latency hides behind this stage's work.
    uint4 xv[C][2];
#pragma unroll
    for (int j = 0; j < C; ++j) xv[j][0] = xnext[j][0], xv[j][1] = xnext[j][1];
    if (st + 1 < stages) load_x(st + 1, xnext);
    const uint32_t slot = ring + (st % S) * rs.stage_bytes;
    if constexpr (LDGSTS) {
      asm volatile("cp.async.wait_group %0;" ::"n"(S - 1) : "memory");
      __syncwarp();  // the scales were copied by other lanes
    } else {
      bar_wait(bars + (st % S) * 8, (st / S) & 1);
    }
    const int gi0 = first_group(b);
#pragma unroll
    for (int j = 0; j < C; ++j) {
      if (j < cnt) {
        const uint4 q = lds128(slot + j * 512 + lane * 16);
        const uint32_t words[4] = {q.x, q.y, q.z, q.w};
        const uint32_t xs[8] = {xv[j][0].x, xv[j][0].y, xv[j][0].z, xv[j][0].w,
                                xv[j][1].x, xv[j][1].y, xv[j][1].z, xv[j][1].w};
        const int gl = first_group(b + j) - gi0;  // this block's (first) group in the stage
        const uint32_t saddr = slot + C * 512 + (gl * 16 + 2 * g) * esize;
        float cg[4] = {0.f, 0.f, 0.f, 0.f}, cx[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          uint32_t a[4];
          int4_word_to_fragment(words[k], lo_base, hi_base, a);
          mma_16816(cg, a, xs[2 * k], xs[2 * k + 1]);
          if (p.asym) mma_16816(cx, ones, xs[2 * k], xs[2 * k + 1]);
          if (G32 && k == 1) flush(cg, cx, saddr);
        }
        flush(cg, cx, saddr + (G32 ? 16 * esize : 0));
      }
    }
    __syncwarp();  // every lane has read the slot: refill it
    if constexpr (LDGSTS) {
      if (st + S < stages) issue(st + S);
      asm volatile("cp.async.commit_group;" ::: "memory");
    } else if (lane == 0 && st + S < stages) {
      issue(st + S);
    }
  }

  __shared__ float4 partial[16][32];
  if (p.ksplit > 1) {
    partial[warp][lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    __syncthreads();
    if (kpart != 0) return;
    for (int i = 1; i < p.ksplit; ++i) {
      const float4 v = partial[warp + i][lane];
      acc[0] += v.x;
      acc[1] += v.y;
      acc[2] += v.z;
      acc[3] += v.w;
    }
  }
  store_gemv_tile(p, tile, g, t, acc);
}

int g_ring_stage = 0, g_ring_depth = 0, g_sms = 0, g_smem_optin = 0;
bool g_ldgsts = true;

template <bool G32, int C, int S, bool LDGSTS>
void launch_ring(const Params& q, int kb_per, const RingShape& rs, unsigned blocks,
                 unsigned threads, cudaStream_t stream) {
  auto kernel = gemv4_ring_kernel<G32, C, S, LDGSTS>;
  // Raise the dynamic shared-memory cap once per kernel to all a block may take next to its
  // 8 KB of static reduction space (the launch still asks only for what it uses).
  static bool raised = false;
  if (!raised) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    g_smem_optin - 8 * 1024),
               "cudaFuncSetAttribute (gemv4 ring)");
    raised = true;
  }
  const int bytes = static_cast<int>(threads / 32) * rs.warp_bytes;
  GYRE_CHECK(bytes <= g_smem_optin - 8 * 1024, "qlinear gemv: ring of ", bytes,
             " bytes does not fit a block");
  kernel<<<blocks, threads, bytes, stream>>>(q, kb_per, rs);
  check_cuda(cudaGetLastError(), "gemv4 ring launch");
}

template <int C, int S>
void launch_ring_g(const Params& q, int kb_per, const RingShape& rs, unsigned blocks,
                   unsigned threads, cudaStream_t stream) {
  if (g_ldgsts) {
    if (q.group == 32) return launch_ring<true, C, S, true>(q, kb_per, rs, blocks, threads, stream);
    return launch_ring<false, C, S, true>(q, kb_per, rs, blocks, threads, stream);
  }
  if (q.group == 32) return launch_ring<true, C, S, false>(q, kb_per, rs, blocks, threads, stream);
  return launch_ring<false, C, S, false>(q, kb_per, rs, blocks, threads, stream);
}

}  // namespace

// ksplit: 0 = auto; ldgsts: the copy engine (see gemv4_ring_kernel).
void launch_gemv4_ring(const Params& p, int ksplit, bool ldgsts, cudaStream_t stream) {
  if (g_sms == 0) {
    int dev = 0;
    check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&g_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
               "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev),
               "cudaDeviceGetAttribute");
  }
  g_ldgsts = ldgsts;
  const int c = g_ring_stage == 0 ? 4 : g_ring_stage, s = g_ring_depth == 0 ? 4 : g_ring_depth;
  Params q = p;
  int ks = ksplit;
  if (ks == 0) {
    // About one resident wave of warps (~24 per SM), each with at least one full ring of
    // column blocks: more warps only add reductions once the bytes in flight suffice.
    ks = 1;
    while (ks < 16 && q.tiles * ks * 2 <= g_sms * 24 && q.kblocks / (2 * ks) >= c * s / 2) ks *= 2;
  }
  q.ksplit = ks;
  const int kb_per = (q.kblocks + ks - 1) / ks;
  const int warps = std::max(8, ks), tiles_per_block = warps / ks;
  const unsigned blocks = static_cast<unsigned>((q.tiles + tiles_per_block - 1) / tiles_per_block);
  const RingShape rs = ring_shape(q, c, s);
  const unsigned threads = warps * 32;
  switch (c * 100 + s) {
    case 108:
      return launch_ring_g<1, 8>(q, kb_per, rs, blocks, threads, stream);
    case 116:
      return launch_ring_g<1, 16>(q, kb_per, rs, blocks, threads, stream);
    case 204:
      return launch_ring_g<2, 4>(q, kb_per, rs, blocks, threads, stream);
    case 208:
      return launch_ring_g<2, 8>(q, kb_per, rs, blocks, threads, stream);
    case 402:
      return launch_ring_g<4, 2>(q, kb_per, rs, blocks, threads, stream);
    default:
      return launch_ring_g<4, 4>(q, kb_per, rs, blocks, threads, stream);
  }
}

void set_gemv_ring(int stage_blocks, int depth) {
  g_ring_stage = stage_blocks;
  g_ring_depth = depth;
}

}  // namespace gyre::qlinear_detail
