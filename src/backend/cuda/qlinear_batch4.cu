// 4-bit serving-batch matmul (n = 1..128) with cp.async pipelines and a cluster split-K.
//
// Why (bench/qlinear_notes.md, round 3): the register-fed batch kernel (qlinear_batch.cu) is
// bounded by (a) x re-read from L2 by every warp (each warp owned one 16-row tile: x traffic =
// tiles x |x|, 8x the weight bytes at n = 32) and (b) bytes in flight held in registers that the
// accumulators also need. Here a block of 8 warps owns 8 * MT tiles and walks one k-range in
// lockstep: x for a 64-column block is staged once per block in shared memory, and weights,
// scales and x arrive through a kStages-deep cp.async ring (bytes in flight cost shared memory,
// not registers). The k-range is split over the KS blocks of a thread block cluster, which sum
// their partial accumulators through distributed shared memory before the epilogue.
//
// Shared memory per stage: x [8 NT tokens][64 columns] (row 128 bytes; odd rows swap their
// 16-byte halves so a quarter-warp's two rows hit disjoint banks), weights [8 warps][MT][32
// lanes] x 16 bytes, scales and mins [8 warps][MT][128 bytes] (the tile's 16-entry group
// runs of the block, as stored in the tiled layout).
#include <cooperative_groups.h>

#include <algorithm>

#include "backend/cuda/qlinear_kernels.cuh"

namespace gyre::qlinear_detail {

void check_cuda(cudaError_t e, const char* what);  // qlinear.cu

namespace {

namespace cg = cooperative_groups;

constexpr int kWarps = 8;
constexpr int kStages = 6;
constexpr int kScaleSlot = 128;  // bytes of scales (and again of mins) per tile and stage
int g_ks = 0, g_mt = 0;

template <int MT, int NT>
struct Layout {
  static constexpr int kX = NT * 8 * 128;
  static constexpr int kW = kWarps * MT * 512;
  static constexpr int kS = kWarps * MT * kScaleSlot;
  static constexpr int kStage = kX + kW + 2 * kS;
  static constexpr int kReduce = kWarps * 32 * MT * NT * 4 * 4;
  static constexpr int kBytes = std::max(kStage * kStages, kReduce);
};

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

template <bool G32, int MT, int NT>
__device__ __forceinline__ void issue_stage(const Params& p, uint8_t* stage, int b, int tok0,
                                            const int (&tiles)[MT]) {
  using L = Layout<MT, NT>;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // x: 8 NT rows x 8 pieces of 16 bytes.
  uint8_t* xs = stage;
  for (int piece = tid; piece < NT * 64; piece += kWarps * 32) {
    const int r = piece >> 3, u = piece & 7, c = 64 * b + 8 * u;
    const __half* row = p.x + int64_t{min(tok0 + r, p.n - 1)} * p.cols;
    uint8_t* dst = xs + r * 128 + ((u ^ ((r & 1) << 2)) << 4);
    if (p.perm == nullptr) {
      cp_async16(dst, row + min(c, p.cols - 8), c < p.cols ? 16 : 0);
    } else {
      __half hx[8];
#pragma unroll
      for (int i = 0; i < 8; ++i)
        hx[i] = c < p.cols ? row[__ldg(p.perm + c + i)] : __float2half_rn(0.f);
      memcpy(dst, hx, 16);
    }
  }
  // Weights and scale runs of this warp's tiles.
  const int esize = p.scale_f32 ? 4 : 2;
  const int gi = G32 ? 2 * b : (64 * b) >> p.group_log2;
  const int chunks = esize * (G32 ? 2 : 1);  // 16-byte chunks of one run (16 entries per group)
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    uint8_t* ws = stage + L::kX + ((warp * MT + mt) * 32 + lane) * 16;
    cp_async16(ws, p.qweight + ((int64_t{tiles[mt]} * p.kblocks + b) * 32 + lane) * 16, 16);
    const int64_t run = (int64_t{tiles[mt]} * p.groups_p + gi) * 16 * esize;
    uint8_t* ss = stage + L::kX + L::kW + (warp * MT + mt) * kScaleSlot;
    if (lane < chunks) {
      cp_async16(ss + lane * 16, static_cast<const uint8_t*>(p.scales) + run + lane * 16, 16);
    } else if (p.asym && lane >= 16 && lane < 16 + chunks) {
      cp_async16(ss + L::kS + (lane - 16) * 16,
                 static_cast<const uint8_t*>(p.mins) + run + (lane - 16) * 16, 16);
    }
  }
}

// (row g, row g+8) entries of group half k from a staged run, as broadcast half2.
__device__ __forceinline__ void staged_pair(const uint8_t* run, bool f32, int k, int g, __half2& lo,
                                            __half2& hi) {
  if (f32) {
    const float2 v = *reinterpret_cast<const float2*>(run + (k * 16 + 2 * g) * 4);
    lo = __float2half2_rn(v.x);
    hi = __float2half2_rn(v.y);
  } else {
    const __half2 v = *reinterpret_cast<const __half2*>(run + (k * 16 + 2 * g) * 2);
    lo = __low2half2(v);
    hi = __high2half2(v);
  }
}

template <bool G32, int MT, int NT>
__global__ void __launch_bounds__(kWarps * 32) batch4_kernel(Params p, int ks_blocks) {
  cuda::pdl_begin();  // launched with PDL (launch.h)
  using L = Layout<MT, NT>;
  extern __shared__ __align__(128) uint8_t smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int tile0 = blockIdx.x * kWarps * MT;
  const int tok0 = blockIdx.z * 8 * NT;
  int tiles[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) tiles[mt] = min(tile0 + warp * MT + mt, p.tiles - 1);
  // This block's share of the column blocks.
  const int per = (p.kblocks + ks_blocks - 1) / ks_blocks;
  const int kb0 = min(p.kblocks, static_cast<int>(blockIdx.y) * per);
  const int kb1 = min(p.kblocks, kb0 + per);
  const int count = kb1 - kb0;

  const __half2 lo_base = __float2half2_rn(p.asym ? 1024.f : 1032.f);
  const __half2 hi_base = __float2half2_rn(p.asym ? -64.f : -72.f);
  float acc[MT * NT * 4];
#pragma unroll
  for (int i = 0; i < MT * NT * 4; ++i) acc[i] = 0.f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < count) issue_stage<G32, MT, NT>(p, smem + s * L::kStage, kb0 + s, tok0, tiles);
    cp_async_commit();
  }
  for (int i = 0; i < count; ++i) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage i visible to all; stage i - 1 free for reuse
    if (i + kStages - 1 < count)
      issue_stage<G32, MT, NT>(p, smem + (i + kStages - 1) % kStages * L::kStage,
                               kb0 + i + kStages - 1, tok0, tiles);
    cp_async_commit();
    const uint8_t* stage = smem + i % kStages * L::kStage;
    uint4 q[MT];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      q[mt] = *reinterpret_cast<const uint4*>(stage + L::kX + ((warp * MT + mt) * 32 + lane) * 16);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint4 x[NT];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int r = 8 * nt + g, u = (4 * h + t) ^ ((g & 1) << 2);
        x[nt] = *reinterpret_cast<const uint4*>(stage + r * 128 + u * 16);
      }
      __half2 s_lo[MT], s_hi[MT], m_lo[MT], m_hi[MT];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const uint8_t* run = stage + L::kX + L::kW + (warp * MT + mt) * kScaleSlot;
        staged_pair(run, p.scale_f32, G32 ? h : 0, g, s_lo[mt], s_hi[mt]);
        m_lo[mt] = m_hi[mt] = __float2half2_rn(0.f);
        if (p.asym) staged_pair(run + L::kS, p.scale_f32, G32 ? h : 0, g, m_lo[mt], m_hi[mt]);
      }
#pragma unroll
      for (int jj = 0; jj < 2; ++jj)
        mma_scaled_step<MT, NT>(acc, q, 2 * h + jj, x, s_lo, s_hi, m_lo, m_hi, lo_base, hi_base);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is now reused for the partial sums

  // Partial sums [element][thread] (element-major: a thread's stores and the reducers' loads
  // are both consecutive), then block rank r of the cluster finishes elements r, r + KS, ...
  constexpr int kElems = MT * NT * 4;
  float* part = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int e = 0; e < kElems; ++e) part[e * kWarps * 32 + threadIdx.x] = acc[e];
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int rank = static_cast<int>(cluster.block_rank());
  for (int idx = rank * kWarps * 32 + threadIdx.x; idx < kElems * kWarps * 32;
       idx += ks_blocks * kWarps * 32) {
    float v = 0.f;
    for (int q = 0; q < ks_blocks; ++q) v += cluster.map_shared_rank(part, q)[idx];
    const int e = idx / (kWarps * 32), th = idx % (kWarps * 32);
    const int w = th >> 5, l = th & 31, gg = l >> 2, tt = l & 3;
    const int mt = e / (NT * 4), nt = (e / 4) % NT, i = e % 4;
    const int tile = tile0 + w * MT + mt;
    const int tok = tok0 + 8 * nt + 2 * tt + (i % 2);
    if (tile >= p.tiles || tok >= p.n) continue;
    // SwiGLU: the gate's reducer also sums the up row (element e + 2).
    store_batch_element(p, tile, gg, i, tok, v, [&] {
      float up = 0.f;
      for (int q = 0; q < ks_blocks; ++q)
        up += cluster.map_shared_rank(part, q)[idx + 2 * kWarps * 32];
      return up;
    });
  }
  cluster.sync();  // no block leaves while others read its shared memory
}

template <int MT, int NT>
void allow_shared_memory() {
  using L = Layout<MT, NT>;
  for (auto kernel : {batch4_kernel<true, MT, NT>, batch4_kernel<false, MT, NT>}) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L::kBytes),
               "cudaFuncSetAttribute (qlinear batch4)");
  }
}

}  // namespace

// Raises the dynamic shared-memory limit of every instantiation, once per device; called at
// 4-bit weight upload too, so that it never first happens inside a graph capture.
void prepare_batch4() {
  static uint64_t done_devices = 0;
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  const uint64_t bit = dev < 64 ? uint64_t{1} << dev : 0;
  if (bit != 0 && (done_devices & bit) != 0) return;
  allow_shared_memory<1, 1>();
  allow_shared_memory<1, 2>();
  allow_shared_memory<1, 4>();
  allow_shared_memory<1, 8>();
  allow_shared_memory<2, 1>();
  allow_shared_memory<2, 2>();
  allow_shared_memory<2, 4>();
  allow_shared_memory<2, 8>();
  done_devices |= bit;
}

namespace {

template <int MT, int NT>
void launch(const Params& p, cudaStream_t stream) {
  using L = Layout<MT, NT>;
  const int row_blocks = (p.tiles + kWarps * MT - 1) / (kWarps * MT);
  const int token_groups = (p.n + 8 * NT - 1) / (8 * NT);
  int ks = g_ks;
  if (ks == 0) {
    // Measured: one tile per warp wants many blocks (up to 8-way split-K); two tiles per warp
    // about 1.7 blocks per SM up to 32 tokens and about one beyond (more compute per block).
    const int target = MT == 1 ? 512 : p.n <= 32 ? 224 : 112;
    ks = 1;
    while (ks < 8 && row_blocks * token_groups * ks < target && p.kblocks / (2 * ks) >= kStages)
      ks *= 2;
  }
  const bool g32 = p.group == 32;
  auto kernel = g32 ? batch4_kernel<true, MT, NT> : batch4_kernel<false, MT, NT>;
  prepare_batch4();
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(row_blocks), static_cast<unsigned>(ks),
                     static_cast<unsigned>(token_groups));
  cfg.blockDim = dim3(kWarps * 32);
  cfg.dynamicSmemBytes = L::kBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = static_cast<unsigned>(ks);
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (qlinear_pdl()) cuda::add_pdl(cfg, attr);
  check_cuda(cudaLaunchKernelEx(&cfg, kernel, p, ks), "qlinear batch4 launch");
}

template <int MT>
void launch_by_n(const Params& p, cudaStream_t stream) {
  if (p.n <= 8) return launch<MT, 1>(p, stream);
  if (p.n <= 16) return launch<MT, 2>(p, stream);
  if (p.n <= 32) return launch<MT, 4>(p, stream);
  return launch<MT, 8>(p, stream);
}

}  // namespace

void launch_batch4(const Params& p, cudaStream_t stream) {
  int mt = g_mt;
  if (mt == 0) mt = p.tiles >= 384 ? 2 : 1;  // x reuse where the grid stays large enough
  if (mt == 1) return launch_by_n<1>(p, stream);
  return launch_by_n<2>(p, stream);
}

void set_batch4_ksplit(int ks) {
  g_ks = ks;
}
void set_batch4_tiles_per_warp(int mt) {
  g_mt = mt;
}

}  // namespace gyre::qlinear_detail
