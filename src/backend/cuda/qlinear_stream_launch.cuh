// The host side of the stream decode GEMV (qlinear_stream.cuh): the device limits it plans with,
// its split-K and one-wave grid, whether a shared-memory ring (with staged scales) fits, and the
// launches of gemv_stream_kernel by width, pieces, ring and scale variant.
#pragma once
#include <string>

#include "backend/cuda/qlinear_stream.cuh"

namespace gyre::qlinear_detail {

// The device's SM count and opt-in shared memory per block (queried once; qlinear_gemv_stream.cu).
void stream_device_limits(int& sms, int& smem_optin);

// Lets `kernel` use the device's opt-in shared memory minus its static shared memory (the 48 KB
// default counts static and dynamic together). Call once per kernel instantiation (a function
// static at the call site); returns true for that purpose.
template <typename Kernel>
bool allow_optin_shared(Kernel kernel, int optin, const char* what) {
  cudaFuncAttributes attr{};
  check_cuda(cudaFuncGetAttributes(&attr, kernel),
             (std::string("cudaFuncGetAttributes (") + what + ")").c_str());
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  optin - static_cast<int>(attr.sharedSizeBytes)),
             (std::string("cudaFuncSetAttribute (") + what + ")").c_str());
  return true;
}

// GYRE_CUDA_INT4_LOP3 (1, the default, or 0) as the 4-bit stream GEMV's decode; set_int4_lop3
// (-1: the variable) overrides it, for an A/B in one process (qlinear_gemv_stream.cu).
void set_int4_lop3(int mode);

// The split-K for `tiles` 16-row tiles of `pieces` pieces at n tokens: the largest that keeps
// tiles x ksplit within warp_budget / 2 warps per SM on average (GYRE_CUDA_STREAM_BUDGET, a bench
// knob, overrides the budget at n <= 2). stream_ksplit: a launch's, ksplit (0: that one).
int stream_budget_override();  // qlinear_gemv_stream.cu
inline int stream_ksplit_for(int tiles, int pieces, int n, int warp_budget) {
  int sms = 0, optin = 0;
  stream_device_limits(sms, optin);
  if (stream_budget_override() > 0 && n <= 2) warp_budget = stream_budget_override();
  int ks = 1;
  while (ks < 16 && tiles * ks * 2 <= sms * warp_budget && pieces >= 2 * ks) ks *= 2;
  return ks;
}
inline int stream_ksplit(const Params& p, int S, int ksplit, int warp_budget) {
  return ksplit != 0 ? ksplit : stream_ksplit_for(p.tiles, p.kblocks / S, p.n, warp_budget);
}

// GYRE_CUDA_STREAM_WAVE (default on) and the resident blocks per SM of a kernel at that block
// size and dynamic shared memory on the current device (cached: the query sits on every eager
// launch); qlinear_gemv_stream.cu.
bool stream_one_wave();
int stream_blocks_per_sm(const void* kernel, int threads, size_t smem);

// A stream GEMV grid: ks warps per tile, max(1, 8 / ks) tiles per block, smem_of(ks, warps) bytes
// of dynamic shared memory. With shrink (and stream_one_wave), ks is halved, not below min_ks,
// while the grid takes more than one wave of resident blocks: a second wave of a few blocks costs a
// whole block's time, more than fewer warps per tile do (session 23).
struct StreamGrid {
  int ks = 1, warps = 0;
  unsigned blocks = 0;
  size_t smem = 0;
};
template <class SmemOf>
StreamGrid stream_grid(const void* kernel, int tiles, int ks, int min_ks, bool shrink,
                       SmemOf&& smem_of) {
  int sms = 0, optin = 0;
  stream_device_limits(sms, optin);
  StreamGrid g;
  auto plan = [&] {
    const int tiles_per_block = ks < 8 ? 8 / ks : 1;
    g.ks = ks;
    g.warps = tiles_per_block * ks;
    g.blocks = static_cast<unsigned>((tiles + tiles_per_block - 1) / tiles_per_block);
    g.smem = static_cast<size_t>(smem_of(g.ks, g.warps));
  };
  plan();
  while (shrink && ks > min_ks && stream_one_wave() &&
         g.blocks >
             static_cast<unsigned>(stream_blocks_per_sm(kernel, g.warps * 32, g.smem) * sms)) {
    ks /= 2;
    plan();
  }
  return g;
}

// Whether blocks of `warps` warps, each with warp_bytes of ring slots (and staged scales) after
// the staged x of p, fit the opt-in shared memory (with the kernel's static 8 KB of partial sums).
inline bool stream_ring_smem_fits(const Params& p, int warps, int warp_bytes) {
  int sms = 0, optin = 0;
  stream_device_limits(sms, optin);
  return stream_smem_aligned(p) + warps * warp_bytes + 9 * 1024 <= optin;
}

// Whether the shared-memory ring of P slots per warp fits at the launch's split-K.
template <int BITS, int S, bool G32, bool ASYM>
bool stream_ring_fits(const Params& p, int ksplit, int warp_budget, int P) {
  const int ks = stream_ksplit(p, S, ksplit, warp_budget);
  return stream_ring_smem_fits(p, ks > 8 ? ks : 8, P * StreamRing<BITS, S, G32, ASYM>::kSlotBytes);
}

// Whether the ring of P slots with staged scales fits at every split-K the grid may take (the
// one-wave rule lowers it, and fewer warps per tile stage more groups each).
template <int BITS, int S, bool G32>
bool stream_staged_fits(const Params& p, int P) {
  const int pieces = p.kblocks / S;
  for (int ks = 1; ks <= 16; ks *= 2) {
    const int per = (pieces + ks - 1) / ks;
    if (!stream_ring_smem_fits(p, ks > 8 ? ks : 8,
                               stream_warp_smem<BITS, S, G32, false, true>(p, per, P)))
      return false;
  }
  return true;
}

// GYRE_CUDA_NORM_AHEAD (default on): whether the stream GEMV loads a fused norm's weights before
// its PDL wait (norm_ahead, qlinear_stream_stage.cuh); qlinear_gemv_stream.cu.
bool stream_norm_ahead();

// GYRE_CUDA_STREAM_SCALES (staged, the default, or ring) or set_stream_staged_scales: whether the
// symmetric ring kernels stage their scales (qlinear_gemv_stream.cu).
bool stream_staged_scales();

// gemv_stream_kernel<...> with the opt-in shared memory allowed (once per instantiation).
template <int BITS, int S, int D, bool G32, bool ASYM, bool INPLACE, int P, int AO, bool SS>
auto raised_stream_kernel(int optin) {
  auto kernel = gemv_stream_kernel<BITS, S, D, G32, ASYM, INPLACE, P, AO, SS>;
  static const bool raised = allow_optin_shared(kernel, optin, "gemv stream");
  (void)raised;
  return kernel;
}

// One launch of gemv_stream_kernel<BITS, S, D, ...> for p (n <= 8, stream_smem(p) within the
// opt-in limit, kblocks a multiple of S). ksplit 0 = auto: the largest split-K that keeps
// tiles x ksplit within warp_budget warps per SM on average (32 measured best at 4 bits on
// every Llama shape, round 5: one resident wave of 64-register warps).
template <int BITS, int S, int D, bool G32, bool ASYM, bool INPLACE, int P = 0, bool SS = false>
void launch_stream_kernel(const Params& p, int ksplit, int warp_budget, cudaStream_t stream) {
  int sms = 0, optin = 0;
  stream_device_limits(sms, optin);
  Params q = p;
  const int pieces = q.kblocks / S;
  void (*kernel)(Params, int) = nullptr;
  if constexpr (stream_act_order_scatters(BITS))  // one instantiation each: act-order, others
    kernel = q.perm != nullptr
                 ? raised_stream_kernel<BITS, S, D, G32, ASYM, INPLACE, P, 2, SS>(optin)
                 : raised_stream_kernel<BITS, S, D, G32, ASYM, INPLACE, P, 1, SS>(optin);
  else
    kernel = raised_stream_kernel<BITS, S, D, G32, ASYM, INPLACE, P, 0, SS>(optin);
  const StreamGrid g =
      stream_grid(reinterpret_cast<const void*>(kernel), q.tiles,
                  stream_ksplit(p, S, ksplit, warp_budget), 1, ksplit == 0, [&](int ks, int warps) {
                    const int per = (pieces + ks - 1) / ks;
                    return P == 0 ? static_cast<size_t>(stream_smem(q))
                                  : static_cast<size_t>(stream_smem_aligned(q)) +
                                        static_cast<size_t>(warps) *
                                            stream_warp_smem<BITS, S, G32, ASYM, SS>(q, per, P);
                  });
  const int ks = g.ks;
  q.ksplit = ks;
  q.norm_ahead = stream_norm_ahead();
  const int per = (pieces + ks - 1) / ks;
  qlaunch(kernel, g.blocks, g.warps * 32, g.smem, stream, q, per);
}

// The shared-memory-ring kernel (P slots) for symmetric in-place weights, by group size, with
// staged scales where they are on and fit (the callers check that p is symmetric and that
// stream_ring_fits holds).
template <int BITS, int S, int P, bool G32>
void launch_stream_ring_g(const Params& p, int ksplit, int warp_budget, cudaStream_t stream) {
  if (stream_staged_scales() && stream_staged_fits<BITS, S, G32>(p, P))
    return launch_stream_kernel<BITS, S, 1, G32, false, true, P, true>(p, ksplit, warp_budget,
                                                                       stream);
  launch_stream_kernel<BITS, S, 1, G32, false, true, P>(p, ksplit, warp_budget, stream);
}
template <int BITS, int S, int P>
void launch_stream_ring(const Params& p, int ksplit, int warp_budget, cudaStream_t stream) {
  if (p.group == 32) return launch_stream_ring_g<BITS, S, P, true>(p, ksplit, warp_budget, stream);
  launch_stream_ring_g<BITS, S, P, false>(p, ksplit, warp_budget, stream);
}

// The four scale variants (group 32 or larger, symmetric or not) of S and D.
template <int BITS, int S, int D, bool INPLACE = false>
void launch_stream_variant(const Params& p, int ksplit, int warp_budget, cudaStream_t stream) {
  const bool g32 = p.group == 32;
  if (p.asym) {
    if (g32)
      return launch_stream_kernel<BITS, S, D, true, true, INPLACE>(p, ksplit, warp_budget, stream);
    return launch_stream_kernel<BITS, S, D, false, true, INPLACE>(p, ksplit, warp_budget, stream);
  }
  if (g32)
    return launch_stream_kernel<BITS, S, D, true, false, INPLACE>(p, ksplit, warp_budget, stream);
  return launch_stream_kernel<BITS, S, D, false, false, INPLACE>(p, ksplit, warp_budget, stream);
}

}  // namespace gyre::qlinear_detail
