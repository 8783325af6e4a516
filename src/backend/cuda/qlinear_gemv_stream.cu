// The 4-bit decode GEMV (n = 1..8, tiled layout of qlinear_tiled.cu) as a register pipeline: the
// stream kernel of qlinear_stream.cuh (which says why and how) at 4 bits, ring depth 4, 8 or 16
// (set_gemv_depth), or (symmetric weights, depth 4) the shared-memory ring of 4 pieces per warp
// (set_gemv_smem_ring). Handles f16 scales only (f32-scale repacks stay on the register-fed
// kernel). The decode's (w & mask) | 0x6400 takes one explicit LOP3 instead of ptxas's two
// (int4_word_to_fragment_lop3, symmetric weights; GYRE_CUDA_INT4_LOP3=0 keeps the old for an
// A/B, same results).
#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "backend/cuda/qlinear_stream_launch.cuh"
#include "core/error.h"

namespace gyre::qlinear_detail {

namespace {
int g_depth = 0, g_sms = 0, g_smem_optin = 0;
int g_lop3 = -1;  // -1: GYRE_CUDA_INT4_LOP3 (default on)

bool int4_lop3() {
  if (g_lop3 < 0) {
    const char* e = std::getenv("GYRE_CUDA_INT4_LOP3");
    g_lop3 = e != nullptr && std::string(e) == "0" ? 0 : 1;
  }
  return g_lop3 == 1;
}

// The shared-memory ring's depth for symmetric weights: GYRE_CUDA_GEMV_SMEM (0: the register
// ring; 2 or 4, the default), or set_gemv_smem_ring.
int g_ring = -1;
int smem_ring() {
  if (g_ring < 0) {
    const char* e = std::getenv("GYRE_CUDA_GEMV_SMEM");
    g_ring = e == nullptr || *e == 0 ? 4 : std::atoi(e);
  }
  return g_ring;
}

// Ring depth D (register ring) or the shared-memory ring. The one-LOP3 decode and the
// shared-memory ring are instantiated for symmetric weights only: the asymmetric g128 kernel at
// ring 4 spills 48 bytes with the LOP3 decode against 36 without (ptxas, session 11), so
// asymmetric weights keep the old decode and the register ring until measured.
template <int D>
void launch_depth(const Params& p, int ksplit, cudaStream_t stream) {
  if (int4_lop3() && !p.asym) {
    const int ring = D == 4 ? smem_ring() : 0;
    if ((ring == 2 || ring == 4) && stream_ring_fits<4, 1, true, false>(p, ksplit, 32, ring)) {
      if (ring == 2) return launch_stream_ring<4, 1, 2>(p, ksplit, 32, stream);
      return launch_stream_ring<4, 1, 4>(p, ksplit, 32, stream);
    }
    if (p.group == 32)
      return launch_stream_kernel<4, 1, D, true, false, true>(p, ksplit, 32, stream);
    return launch_stream_kernel<4, 1, D, false, false, true>(p, ksplit, 32, stream);
  }
  launch_stream_variant<4, 1, D>(p, ksplit, 32, stream);
}
}  // namespace

// Session 23 (H100, Llama-3-8B shape, decode @128): 2-bit 394 -> 537 tok/s, 3-bit 479 -> 527,
// 5-bit 390 -> 412, 4 and 6 bits unchanged (their plans were one wave already); on by default,
// GYRE_CUDA_STREAM_WAVE=0 keeps the old plan.
bool stream_one_wave() {
  static const bool on = [] {
    const char* e = std::getenv("GYRE_CUDA_STREAM_WAVE");
    return e == nullptr || std::string(e) != "0";
  }();
  return on;
}

int stream_blocks_per_sm(const void* kernel, int threads, size_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int, size_t>, int> cache;
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  const auto key = std::make_tuple(dev, kernel, threads, smem);
  std::lock_guard<std::mutex> lock(mu);
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  int per_sm = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor (gemv stream)");
  cache.emplace(key, per_sm);
  return per_sm;
}

int stream_budget_override() {
  static const int budget = [] {
    const char* e = std::getenv("GYRE_CUDA_STREAM_BUDGET");
    return e != nullptr ? std::max(0, std::atoi(e)) : 0;
  }();
  return budget;
}

bool stream_norm_ahead() {
  static const bool on = [] {
    const char* e = std::getenv("GYRE_CUDA_NORM_AHEAD");
    return e == nullptr || std::string(e) != "0";
  }();
  return on;
}

namespace {
int g_staged = -1;  // -1: GYRE_CUDA_STREAM_SCALES (staged unless "ring")
}  // namespace

bool stream_staged_scales() {
  if (g_staged < 0) {
    const char* e = std::getenv("GYRE_CUDA_STREAM_SCALES");
    g_staged = e != nullptr && std::string(e) == "ring" ? 0 : 1;
  }
  return g_staged == 1;
}

void set_stream_staged_scales(int mode) {
  GYRE_CHECK(mode >= -1 && mode <= 1, "qlinear: staged scales mode must be -1, 0 or 1");
  g_staged = mode;
}

void set_int4_lop3(int mode) {
  GYRE_CHECK(mode >= -1 && mode <= 1, "qlinear: int4 LOP3 mode must be -1, 0 or 1");
  g_lop3 = mode;
}

void stream_device_limits(int& sms, int& smem_optin) {
  if (g_sms == 0) {
    int dev = 0;
    check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&g_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
               "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev),
               "cudaDeviceGetAttribute");
  }
  sms = g_sms;
  smem_optin = g_smem_optin;
}

bool gemv4_stream_supported(const Params& p) {
  int sms = 0, optin = 0;
  stream_device_limits(sms, optin);
  // x for all n tokens must leave room for 3 blocks per SM (a third of the opt-in maximum).
  return !p.scale_f32 && p.n >= 1 && p.n <= 8 && stream_smem(p) <= (optin - 8 * 1024) / 3;
}

void launch_gemv4_stream(const Params& p, int ksplit, cudaStream_t stream) {
  if (g_depth == 8) return launch_depth<8>(p, ksplit, stream);
  if (g_depth == 16) return launch_depth<16>(p, ksplit, stream);
  launch_depth<4>(p, ksplit, stream);
}

void set_gemv_depth(int depth) {
  g_depth = depth;
}

void set_gemv_smem_ring(int depth) {
  GYRE_CHECK(depth == -1 || depth == 0 || depth == 2 || depth == 4,
             "qlinear: the shared-memory ring depth must be -1, 0, 2 or 4");
  g_ring = depth;
}

}  // namespace gyre::qlinear_detail
