// The 4-bit decode GEMV (n = 1..8, tiled layout of qlinear_tiled.cu) as a register pipeline: the
// stream kernel of qlinear_stream.cuh (which says why and how) at 4 bits, ring depth 4, 8 or 16
// (set_gemv_depth). Handles f16 scales only (f32-scale repacks stay on the register-fed kernel).
#include "backend/cuda/qlinear_stream.cuh"

namespace gyre::qlinear_detail {

namespace {
int g_depth = 0, g_sms = 0, g_smem_optin = 0;
}  // namespace

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
  if (g_depth == 8) return launch_stream_variant<4, 1, 8>(p, ksplit, 32, stream);
  if (g_depth == 16) return launch_stream_variant<4, 1, 16>(p, ksplit, 32, stream);
  launch_stream_variant<4, 1, 4>(p, ksplit, 32, stream);
}

void set_gemv_depth(int depth) {
  g_depth = depth;
}

}  // namespace gyre::qlinear_detail
