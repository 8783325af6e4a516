// Throughput of the trellis-coded decode GEMV (qlinear_trellis.cu) on the Llama-3-8B shapes at
// n = 1, 2, 8 and K = 2, 3, 4 (ring depth 2 / 4 / 8 and auto), against the 4-bit stream GEMV on the
// same shape, plus the FP16 dequantization. Build: bench/qlinear_device.sh. Weights are random
// bytes (any bits are valid trellis streams; speed only, correctness is in the tests), rotated
// over > 300 MB so the numbers are DRAM numbers. %copy = (stored bytes: K + 16/128 bits per
// weight, plus x and y) / time against a device-to-device copy.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/qlinear.h"

using namespace gyre;

#include "bench_common.cuh"

int main() {
  const double copy_gbs = print_device_and_copy_gbs();

  const int shapes[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}, {6144, 4096}, {28672, 4096}};
  __half *x, *y, *deq;
  CK(cudaMalloc(&x, 16 * 14336 * 2));
  CK(cudaMalloc(&y, 16 * 28672 * 2));
  CK(cudaMalloc(&deq, size_t(28672) * 4096 * 2));
  fill_halves<<<1024, 256>>>(x, 16 * 14336, -1.0f, 2.0f, 5);
  std::printf("\n%-12s %-8s %2s %-7s %9s %8s %7s\n", "shape", "weight", "n", "kernel", "us", "GB/s",
              "%copy");
  for (const auto& sh : shapes) {
    for (const int k : {4, 2, 3, 0}) {  // 0: the 4-bit scalar stream GEMV for reference
      QWeightDesc d;
      d.bits = k == 0 ? 4 : k;
      d.group_size = 128;
      d.rows = sh[0];
      d.cols = sh[1];
      d.trellis = k != 0;
      const double bytes = double(d.qweight_bytes()) + d.scale_count() * 2.0;
      const int copies = std::max(2, int(std::ceil(300e6 / bytes)));
      std::vector<Weight> ws;
      for (int c = 0; c < copies; ++c) ws.push_back(make_weight(d, 11 + c));
      char wname[16];
      std::snprintf(wname, sizeof wname, k == 0 ? "int4" : "tcq%d", k);
      auto row = [&](int n, const char* kernel, float ms) {
        const double moved = bytes + 2.0 * n * (sh[0] + sh[1]);
        std::printf("%5dx%-6d %-8s %2d %-7s %9.2f %8.0f %6.1f%%\n", sh[0], sh[1], wname, n, kernel,
                    ms * 1e3, moved / ms / 1e6, 100.0 * moved / ms / 1e6 / copy_gbs);
      };
      for (const int n : {1, 2, 8}) {
        const std::vector<int> depths = k == 0 ? std::vector<int>{0} : std::vector<int>{0, 2, 4, 8};
        for (const int depth : depths) {
          if (k != 0) qlinear_detail::set_trellis_depth(depth);
          const float ms = time_ms(
              [&](int i) { qlinear_matmul(ws[i % copies].w, x, y, n, nullptr, nullptr); }, 40);
          char kname[16];
          std::snprintf(kname, sizeof kname, depth == 0 ? "auto" : "d%d", depth);
          row(n, kname, ms);
        }
        qlinear_detail::set_trellis_depth(0);
      }
      if (k != 0) {
        // FP16 dequantization (prefill): bytes moved = stored weight + 2 bytes per output.
        const float ms =
            time_ms([&](int i) { qlinear_dequantize(ws[i % copies].w, deq, nullptr); }, 10);
        const double moved = bytes + 2.0 * sh[0] * sh[1];
        std::printf("%5dx%-6d %-8s %2s %-7s %9.2f %8.0f %6.1f%%\n", sh[0], sh[1], wname, "-",
                    "dequant", ms * 1e3, moved / ms / 1e6, 100.0 * moved / ms / 1e6 / copy_gbs);
      }
      CK(cudaGetLastError());
      for (auto& w : ws) CK(cudaFree(w.mem));
    }
  }
  return 0;
}
