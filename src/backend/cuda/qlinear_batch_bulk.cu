// 4-bit serving-batch matmul (n = 1..128) fed by a warp-specialised copy pipeline: producer
// warps fill a shared-memory ring (weights by Hopper bulk copies, cp.async.bulk + mbarrier
// byte counts, or by cp.async; x and scale runs by cp.async), consumer warps wait on a per-stage
// "full" mbarrier, compute, and release the stage through an "empty" mbarrier. The dispatch uses
// it only where it measured faster on H100 (batch_bulk_preferred: the largest weights at 9..16
// and 33..64 tokens, 3-14%); elsewhere qlinear_batch4.cu / qlinear_batch.cu stay faster
// (bench/qlinear_notes.md, round 4).
//
// Why it was tried (round 3): the cp.async kernel spends ~1700 cycles per 8 KB stage; the guess
// was per-thread copy issue and the block-wide barrier. Here no block-wide barrier runs in the
// loop, copy issue is one bulk copy per 16-row tile and stage (in the tiled layout a tile's
// column blocks are contiguous, so KB blocks of a tile are one KB x 512-byte copy), and a stage
// carries CW x MT x KB x 512 bytes of weights (16-64 KB). Outcome: one block still streams only
// ~10-16 GB/s whatever the copy mechanism (all bulk, bulk + cp.async, all cp.async; 1-4
// producer warps), like the round-3 kernels, so the issue cost was not the bound.
//
// A consumer warp owns MT tiles and NT n8 token tiles (8 NT tokens of one token group, grid z);
// x of the stage's columns is staged once per block (row stride KB x 128 + 64 bytes, so a
// quarter-warp's rows g, g + 1 fall on disjoint banks). The k-range is split over the KS blocks
// of a thread-block cluster that sum partials through distributed shared memory in chunks
// before the epilogue (bias, split outputs, SwiGLU), as in qlinear_batch4.cu. Act-order weights
// (perm) are not handled here (x needs a gather).
#include <cooperative_groups.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/qlinear_kernels.cuh"
#include "core/error.h"

namespace gyre::qlinear_detail {

void check_cuda(cudaError_t e, const char* what);  // qlinear.cu

namespace {

namespace cg = cooperative_groups;

constexpr int kBarrierBytes = 256;  // full[8] and empty[8] mbarriers ahead of the ring
constexpr int kMaxStages = 8;
constexpr int kRingBudget = 110 * 1024;        // two blocks per SM
constexpr int kMaxDynamicShared = 227 * 1024;  // sm_90 opt-in limit per block
constexpr int kMaxProducers = 4;
constexpr int kDefaultProducers = 4;  // best of 1, 2, 4 on H100 (round 4)
int g_cfg = 0, g_ks = 0, g_producers = 0;

// Runtime stage layout (bytes; offsets inside one stage).
struct Shape {
  int stages, stage_bytes, off_s, off_m, off_x, sslot;
  int producers;      // producer warps (1..kMaxProducers)
  bool bulk_weights;  // weights by bulk copy (else cp.async pieces)
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred done;\n WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra WAIT_%=;\n}" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, int bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// First and last scale group of column blocks [kbs, kbs + nkb).
template <bool G32>
__device__ __forceinline__ int first_group(const Params& p, int kbs) {
  return G32 ? 2 * kbs : (64 * kbs) >> p.group_log2;
}
template <bool G32>
__device__ __forceinline__ int last_group(const Params& p, int kbs, int nkb) {
  return G32 ? 2 * (kbs + nkb) - 1 : (64 * (kbs + nkb) - 1) >> p.group_log2;
}

// Producer warp, per stage: the weights of each tile as one bulk copy of nkb x 512 bytes (or,
// with sh.bulk_weights off, as 16-byte cp.async pieces); x rows and scale runs as cp.async
// pieces (round 4, first run: the copy engine took ~40 ns per bulk copy whatever its size, so
// only the large weight runs go through it). The full barrier completes when lane 0's
// expect_tx bytes have landed and each lane's cp.async pieces have (32 noinc arrivals).
template <bool G32, int CW, int MT, int NT, int KB>
__device__ __forceinline__ void produce(const Params& p, const Shape& sh, uint8_t* ring,
                                        uint32_t bars, int tile0, int tok0, int kb0, int kb1) {
  // Producer thread index and count over the sh.producers warps.
  const int lane = threadIdx.x - CW * 32, nprod = sh.producers * 32;
  const int esize = p.scale_f32 ? 4 : 2;
  const int valid_tiles = min(CW * MT, p.tiles - tile0);
  const int valid_rows = min(NT * 8, p.n - tok0);
  constexpr int kXStride = KB * 128 + 64;
  for (int kbs = kb0, i = 0; kbs < kb1; kbs += KB, ++i) {
    const int slot = i % sh.stages, round = i / sh.stages;
    const uint32_t full = bars + 8 * slot, empty = bars + 64 + 8 * slot;
    if (round > 0) mbar_wait(empty, (round - 1) & 1);
    const int nkb = min(KB, kb1 - kbs);
    const int g0 = first_group<G32>(p, kbs), g1 = last_group<G32>(p, kbs, nkb);
    const int wbytes = nkb * 512, spieces = (g1 - g0 + 1) * esize;  // 16-byte pieces per run
    if (lane == 0) mbar_expect_tx(full, sh.bulk_weights ? valid_tiles * wbytes : 0);
    // The expected bytes are posted before any producer warp issues a copy of this stage.
    asm volatile("bar.sync 1, %0;" ::"r"(nprod) : "memory");
    uint8_t* stage = ring + slot * sh.stage_bytes;
    if (sh.bulk_weights) {
      for (int k = lane; k < valid_tiles; k += nprod)
        bulk_copy(smem_addr(stage + k * KB * 512),
                  p.qweight + (int64_t{tile0 + k} * p.kblocks + kbs) * 512, wbytes, full);
    } else {
      const int per_tile = nkb * 32;
      for (int piece = lane; piece < valid_tiles * per_tile; piece += nprod) {
        const int k = piece / per_tile, u = piece % per_tile;
        cp_async16(stage + k * KB * 512 + u * 16,
                   p.qweight + (int64_t{tile0 + k} * p.kblocks + kbs) * 512 + u * 16, 16);
      }
    }
    for (int piece = lane; piece < valid_tiles * spieces; piece += nprod) {
      const int k = piece / spieces, u = piece % spieces;
      const int64_t off = (int64_t{tile0 + k} * p.groups_p + g0) * 16 * esize + u * 16;
      cp_async16(stage + sh.off_s + k * sh.sslot + u * 16,
                 static_cast<const uint8_t*>(p.scales) + off, 16);
      if (p.asym)
        cp_async16(stage + sh.off_m + k * sh.sslot + u * 16,
                   static_cast<const uint8_t*>(p.mins) + off, 16);
    }
    // x: 8 pieces of 16 bytes per column block and row; columns past cols are zero-filled.
    for (int piece = lane; piece < valid_rows * nkb * 8; piece += nprod) {
      const int r = piece / (nkb * 8), u = piece % (nkb * 8), c = 64 * kbs + 8 * u;
      cp_async16(stage + sh.off_x + r * kXStride + u * 16,
                 p.x + int64_t{tok0 + r} * p.cols + min(c, p.cols - 8), c < p.cols ? 16 : 0);
    }
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(full) : "memory");
  }
}

template <bool G32, int CW, int MT, int NT, int KB>
__global__ void __launch_bounds__((CW + kMaxProducers) * 32)
    bulk_kernel(Params p, Shape sh, int ks_blocks) {
  cuda::pdl_begin();  // launched with PDL (launch.h)
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int kCT = CW * 32;  // consumer threads
  constexpr int kXStride = KB * 128 + 64;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int tile0 = blockIdx.x * CW * MT;
  const int tok0 = blockIdx.z * 8 * NT;
  const uint32_t bars = smem_addr(smem);
  uint8_t* ring = smem + kBarrierBytes;

  // This block's share of the column blocks, in whole stages.
  const int per = ((p.kblocks + ks_blocks - 1) / ks_blocks + KB - 1) / KB * KB;
  const int kb0 = min(p.kblocks, static_cast<int>(blockIdx.y) * per);
  const int kb1 = min(p.kblocks, kb0 + per);

  // No zeroing: x rows of tokens >= n and tiles past the weight stay stale (their outputs are
  // not stored; mma columns and rows are independent); columns past cols are zero-filled.
  if (threadIdx.x < sh.stages) {
    // full: producer lane 0's expect_tx and one cp.async arrival per producer thread
    mbar_init(bars + 8 * threadIdx.x, 1 + 32 * sh.producers);
    mbar_init(bars + 64 + 8 * threadIdx.x, CW);  // empty: one arrival per consumer warp
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncthreads();

  constexpr int kElems = MT * NT * 4;
  float acc[kElems];
#pragma unroll
  for (int i = 0; i < kElems; ++i) acc[i] = 0.f;

  if (warp >= CW) {
    produce<G32, CW, MT, NT, KB>(p, sh, ring, bars, tile0, tok0, kb0, kb1);
  } else {
    const __half2 lo_base = __float2half2_rn(p.asym ? 1024.f : 1032.f);
    const __half2 hi_base = __float2half2_rn(p.asym ? -64.f : -72.f);
    const int esize = p.scale_f32 ? 4 : 2;
    for (int kbs = kb0, i = 0; kbs < kb1; kbs += KB, ++i) {
      const int slot = i % sh.stages;
      mbar_wait(bars + 8 * slot, (i / sh.stages) & 1);
      const uint8_t* stage = ring + slot * sh.stage_bytes;
      const int nkb = min(KB, kb1 - kbs);
      const int g0 = first_group<G32>(p, kbs);
#pragma unroll
      for (int kb = 0; kb < KB; ++kb) {
        if (kb >= nkb) break;
        uint4 q[MT];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          q[mt] = *reinterpret_cast<const uint4*>(stage + ((warp * MT + mt) * KB + kb) * 512 +
                                                  lane * 16);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint4 x[NT];
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
            x[nt] = *reinterpret_cast<const uint4*>(stage + sh.off_x + (8 * nt + g) * kXStride +
                                                    kb * 128 + (4 * h + t) * 16);
          const int gi = G32 ? 2 * (kbs + kb) + h : (64 * (kbs + kb)) >> p.group_log2;
          const int rel = (gi - g0) * 16 * esize;
          __half2 s_lo[MT], s_hi[MT], m_lo[MT], m_hi[MT];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            const uint8_t* run = stage + sh.off_s + (warp * MT + mt) * sh.sslot + rel;
            const bool f32 = p.scale_f32;
            if (f32) {
              const float2 v = *reinterpret_cast<const float2*>(run + 8 * g);
              s_lo[mt] = __float2half2_rn(v.x);
              s_hi[mt] = __float2half2_rn(v.y);
            } else {
              const __half2 v = *reinterpret_cast<const __half2*>(run + 4 * g);
              s_lo[mt] = __low2half2(v);
              s_hi[mt] = __high2half2(v);
            }
            m_lo[mt] = m_hi[mt] = __float2half2_rn(0.f);
            if (p.asym) {
              const uint8_t* mrun = run + (sh.off_m - sh.off_s);
              if (f32) {
                const float2 v = *reinterpret_cast<const float2*>(mrun + 8 * g);
                m_lo[mt] = __float2half2_rn(v.x);
                m_hi[mt] = __float2half2_rn(v.y);
              } else {
                const __half2 v = *reinterpret_cast<const __half2*>(mrun + 4 * g);
                m_lo[mt] = __low2half2(v);
                m_hi[mt] = __high2half2(v);
              }
            }
          }
#pragma unroll
          for (int jj = 0; jj < 2; ++jj)
            mma_scaled_step<MT, NT>(acc, q, 2 * h + jj, x, s_lo, s_hi, m_lo, m_hi, lo_base,
                                    hi_base);
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(bars + 64 + 8 * slot);
    }
  }
  __syncthreads();  // every stage consumed: the ring is reused for the partial sums

  // Cluster reduction in chunks of kChunk elements ([element][consumer thread] in shared memory);
  // block rank r of the cluster finishes entries r, r + KS, ... of each chunk.
  constexpr int kChunk = kElems < 16 ? kElems : 16;
  float* part = reinterpret_cast<float*>(ring);
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
#pragma unroll
  for (int c0 = 0; c0 < kElems; c0 += kChunk) {
    if (warp < CW) {
#pragma unroll
      for (int e = 0; e < kChunk; ++e) part[e * kCT + threadIdx.x] = acc[c0 + e];
    }
    cluster.sync();
    if (warp < CW) {
      for (int idx = rank * kCT + threadIdx.x; idx < kChunk * kCT; idx += ks_blocks * kCT) {
        float v = 0.f;
        for (int r = 0; r < ks_blocks; ++r) v += cluster.map_shared_rank(part, r)[idx];
        const int e = c0 + idx / kCT, th = idx % kCT;
        const int w = th >> 5, gg = (th & 31) >> 2, tt = th & 3;
        const int mt = e / (NT * 4), nt = (e / 4) % NT, i = e % 4;
        const int tile = tile0 + w * MT + mt;
        const int tok = tok0 + 8 * nt + 2 * tt + (i % 2);
        if (tile >= p.tiles || tok >= p.n) continue;
        // SwiGLU: the up row gg + 8 is two entries further.
        store_batch_element(p, tile, gg, i, tok, v, [&] {
          float up = 0.f;
          for (int r = 0; r < ks_blocks; ++r) up += cluster.map_shared_rank(part, r)[idx + 2 * kCT];
          return up;
        });
      }
    }
    cluster.sync();  // the chunk is read everywhere before it is overwritten (or the block exits)
  }
}

template <int CW, int MT, int NT, int KB>
Shape shape_for(const Params& p, int ring_budget) {
  Shape s{};
  const int esize = p.scale_f32 ? 4 : 2;
  s.sslot = (2 * KB + 1) * 16 * esize;  // at most 2 KB groups (group 32) or KB + 1 (larger)
  const int wb = CW * MT * KB * 512, sb = CW * MT * s.sslot;
  s.off_s = wb;
  s.off_m = wb + sb;
  s.off_x = s.off_m + (p.asym ? sb : 0);
  s.stage_bytes = (s.off_x + NT * 8 * (KB * 128 + 64) + 127) / 128 * 128;
  s.stages = std::clamp(ring_budget / s.stage_bytes, 2, kMaxStages);
  while (s.stages > 2 && kBarrierBytes + s.stages * s.stage_bytes > kMaxDynamicShared) --s.stages;
  return s;
}

// Registers per thread of an instantiation, queried once (first at weight upload, through
// prepare_batch_bulk, so that no query happens inside a graph capture).
template <bool G32, int CW, int MT, int NT, int KB>
int kernel_registers() {
  static int regs = 0;
  if (regs == 0) {
    cudaFuncAttributes fa{};
    check_cuda(cudaFuncGetAttributes(&fa, bulk_kernel<G32, CW, MT, NT, KB>),
               "cudaFuncGetAttributes (qlinear bulk)");
    regs = fa.numRegs;
  }
  return regs;
}

template <bool G32, int CW, int MT, int NT, int KB>
void launch_one(const Params& p, int ks, bool bulk_weights, cudaStream_t stream) {
  auto kernel = bulk_kernel<G32, CW, MT, NT, KB>;
  // Two blocks per SM where the registers allow it, else one with the whole shared memory.
  const int producers = g_producers == 0 ? kDefaultProducers : g_producers;
  const int regs = (kernel_registers<G32, CW, MT, NT, KB>() + 7) / 8 * 8 * (CW + producers) * 32;
  const int ring_budget = 2 * regs <= 65536 ? kRingBudget : kMaxDynamicShared - 8 * 1024;
  Shape sh = shape_for<CW, MT, NT, KB>(p, ring_budget);
  sh.bulk_weights = bulk_weights;
  sh.producers = producers;
  constexpr int kElems = MT * NT * 4;
  constexpr int kReduce = (kElems < 16 ? kElems : 16) * CW * 32 * 4;
  const int bytes = kBarrierBytes + std::max(sh.stages * sh.stage_bytes, kReduce);
  const int row_blocks = (p.tiles + CW * MT - 1) / (CW * MT);
  const int token_groups = (p.n + 8 * NT - 1) / (8 * NT);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(row_blocks), static_cast<unsigned>(ks),
                     static_cast<unsigned>(token_groups));
  cfg.blockDim = dim3((CW + producers) * 32);
  cfg.dynamicSmemBytes = static_cast<size_t>(bytes);
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = static_cast<unsigned>(ks);
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (qlinear_pdl()) cuda::add_pdl(cfg, attr);
  check_cuda(cudaLaunchKernelEx(&cfg, kernel, p, sh, ks), "qlinear bulk launch");
}

// Worst-case stage bytes (f32 scales, asymmetric): two stages must fit in one block's limit.
constexpr int worst_stage(int cw, int mt, int nt, int kb) {
  return cw * mt * (kb * 512 + 2 * (2 * kb + 1) * 64) + nt * 8 * (kb * 128 + 64) + 128;
}
template <int CW, int MT, int NT, int KB>
constexpr int fitting_kb() {
  return kBarrierBytes + 2 * worst_stage(CW, MT, NT, KB) <= kMaxDynamicShared ? KB : KB / 2;
}

// Split-K for 33..64 tokens (measured, round 4): the fewest blocks of the cluster that give at
// least 64 blocks (1 for 28672 rows, 2 for 14336, 4 for 4096 x 14336).
int auto_split_64(const Params& p, int tiles_per_block) {
  const int row_blocks = (p.tiles + tiles_per_block - 1) / tiles_per_block;
  int ks = 1;
  while (ks < 8 && row_blocks * ks < 64) ks *= 2;
  return ks;
}

template <int CW, int MT, int KB>
void launch_cfg(const Params& p, bool bulk_weights, cudaStream_t stream) {
  const int row_blocks = (p.tiles + CW * MT - 1) / (CW * MT);
  const int token_groups = (p.n + 63) / 64;
  int ks = g_ks;
  if (ks == 0 && p.n > 32 && p.n <= 64) {
    ks = auto_split_64(p, CW * MT);
  } else if (ks == 0) {
    // About one block per SM (132 SMs), keeping at least 2 stages per block.
    ks = 1;
    while (ks < 8 && row_blocks * token_groups * ks < 132 && p.kblocks / (2 * ks) >= 2 * KB)
      ks *= 2;
  }
  const bool g32 = p.group == 32;
  auto go = [&](auto nt) {
    constexpr int NT = decltype(nt)::value;
    constexpr int kKB = fitting_kb<CW, MT, NT, KB>();
    if (g32) return launch_one<true, CW, MT, NT, kKB>(p, ks, bulk_weights, stream);
    return launch_one<false, CW, MT, NT, kKB>(p, ks, bulk_weights, stream);
  };
  if (p.n <= 16) return go(std::integral_constant<int, 2>{});
  if (p.n <= 32) return go(std::integral_constant<int, 4>{});
  return go(std::integral_constant<int, 8>{});
}

template <bool G32, int CW, int MT, int NT, int KB>
void allow_one() {
  constexpr int kKB = fitting_kb<CW, MT, NT, KB>();
  check_cuda(cudaFuncSetAttribute(bulk_kernel<G32, CW, MT, NT, kKB>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxDynamicShared),
             "cudaFuncSetAttribute (qlinear bulk)");
  kernel_registers<G32, CW, MT, NT, kKB>();
}
template <int CW, int MT, int KB>
void allow_shared_memory() {
  allow_one<true, CW, MT, 2, KB>();
  allow_one<true, CW, MT, 4, KB>();
  allow_one<true, CW, MT, 8, KB>();
  allow_one<false, CW, MT, 2, KB>();
  allow_one<false, CW, MT, 4, KB>();
  allow_one<false, CW, MT, 8, KB>();
}

}  // namespace

// Raises the dynamic shared-memory limit of every instantiation to the opt-in maximum, once per
// device; called at 4-bit weight upload so that it never first happens inside a graph capture.
void prepare_batch_bulk() {
  static uint64_t done_devices = 0;
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  const uint64_t bit = dev < 64 ? uint64_t{1} << dev : 0;
  if (bit != 0 && (done_devices & bit) != 0) return;
  allow_shared_memory<8, 2, 4>();
  allow_shared_memory<16, 1, 4>();
  allow_shared_memory<8, 1, 8>();
  allow_shared_memory<8, 2, 8>();
  allow_shared_memory<4, 2, 8>();
  done_devices |= bit;
}

// Configurations (consumer warps / tiles per warp / column blocks per stage; 1..5 with the
// weights by bulk copy, 6..10 the same by cp.async) for the benchmark knob; 0 = measured default.
constexpr int kBulkConfigs = 10;
// Where the automatic dispatch takes this kernel (default configuration 8/2/4, 4 producer
// warps), from the H100 sweep of round 4 (bench/qlinear_notes.md): 9..16 tokens on >= 24576
// rows (fused gate/up: 41 vs 44 us), and 33..64 tokens where the split-K above leaves each
// block >= 32 column blocks (28672x4096: 83 vs 97 us, 14336x4096: 51 vs 54, 4096x14336: 67 vs
// 75). Everywhere else the round-3 kernels were faster.
bool batch_bulk_preferred(const Params& p) {
  if (p.bits != 4 || p.perm != nullptr) return false;
  if (p.n > 8 && p.n <= 16) return p.tiles >= 1536;
  if (p.n > 32 && p.n <= 64) return p.kblocks / auto_split_64(p, 16) >= 32;
  return false;
}

void launch_batch_bulk(const Params& p, cudaStream_t stream) {
  GYRE_CHECK(p.bits == 4 && p.perm == nullptr, "qlinear bulk: 4-bit weights without perm only");
  prepare_batch_bulk();
  int cfg = g_cfg;
  if (cfg == 0) cfg = 1;
  const bool bulk = cfg <= 5;
  switch ((cfg - 1) % 5) {
    case 0:
      return launch_cfg<8, 2, 4>(p, bulk, stream);
    case 1:
      return launch_cfg<16, 1, 4>(p, bulk, stream);
    case 2:
      return launch_cfg<8, 1, 8>(p, bulk, stream);
    case 3:
      return launch_cfg<8, 2, 8>(p, bulk, stream);
    default:
      return launch_cfg<4, 2, 8>(p, bulk, stream);
  }
}

void set_batch_bulk_config(int cfg, int ksplit, int producers) {
  GYRE_CHECK(producers >= 0 && producers <= kMaxProducers, "qlinear bulk: producer warps 0..",
             kMaxProducers);
  g_producers = producers;
  GYRE_CHECK(cfg >= 0 && cfg <= kBulkConfigs, "qlinear bulk: config 0..", kBulkConfigs);
  GYRE_CHECK(ksplit == 0 || ksplit == 1 || ksplit == 2 || ksplit == 4 || ksplit == 8,
             "qlinear bulk: split-K 0, 1, 2, 4 or 8");
  g_cfg = cfg;
  g_ks = ksplit;
}

}  // namespace gyre::qlinear_detail
