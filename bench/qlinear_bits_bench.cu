// Throughput of the 2/3/5/6-bit GEMV (qlinear_bits.cu) on Llama-3-8B shapes, n = 1 and 8 (and
// n = 16 through the chunked path), plus the FP16 dequantization the backend uses for n > 8.
// Build: bench/qlinear_device.sh. Weights are random bytes (speed only; correctness is in the
// tests), rotated over > 300 MB so the numbers are DRAM numbers.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/cuda/qlinear.h"

using namespace gyre;

#include "bench_common.cuh"

Weight make(const QWeightDesc& d, uint32_t seed) {
  return make_weight(d, seed);
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  const size_t big = size_t(1) << 30;
  void *s, *t;
  CK(cudaMalloc(&s, big));
  CK(cudaMalloc(&t, big));
  CK(cudaMemset(s, 1, big));
  const float copy_ms =
      time_ms([&](int) { CK(cudaMemcpyAsync(t, s, big, cudaMemcpyDeviceToDevice)); }, 10);
  const double copy_gbs = 2.0 * big / copy_ms / 1e6;  // bytes read + written
  std::printf("copy bandwidth: %.0f GB/s\n", copy_gbs);
  CK(cudaFree(s));
  CK(cudaFree(t));

  const int shapes[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}};
  __half *x, *y, *deq;
  CK(cudaMalloc(&x, 16 * 14336 * 2));
  CK(cudaMalloc(&y, 16 * 14336 * 2));
  CK(cudaMalloc(&deq, size_t(14336) * 4096 * 2));
  fill_halves<<<1024, 256>>>(x, 16 * 14336, -1.0f, 2.0f, 5);
  std::printf(
      "\nqlinear_matmul, 2/3/5/6 bits, f16 scales; GB/s = (weight + scales + x + y bytes) / time\n"
      "%-12s %4s %-5s %2s %4s %9s %8s %7s %12s\n",
      "shape", "bits", "g/sym", "n", "rows", "us", "GB/s", "%copy", "dequant us");
  for (const auto& sh : shapes) {
    for (const int bits : {2, 3, 5, 6}) {
      for (const bool asym : {false, true}) {
        if (asym && sh[0] != 4096) continue;  // one asymmetric shape is enough
        QWeightDesc d;
        d.bits = bits;
        d.group_size = 128;
        d.asymmetric = asym;
        d.rows = sh[0];
        d.cols = sh[1];
        const double bytes = double(d.qweight_bytes()) + d.scale_count() * (asym ? 4.0 : 2.0);
        const int copies = std::max(1, int(std::ceil(300e6 / bytes)));
        std::vector<Weight> ws;
        for (int c = 0; c < copies; ++c) ws.push_back(make(d, 17 + c));
        const float dq_ms =
            time_ms([&](int i) { qlinear_dequantize(ws[i % copies].w, deq, nullptr); }, 10);
        // rows = weight rows per warp (the set_bits_rows knob; 2 is the default).
        for (const int n : {1, 8, 16}) {
          for (const int rows : {2, 4}) {
            if (n == 16 && rows == 4) continue;
            qlinear_detail::set_bits_rows(rows);
            const float ms = time_ms(
                [&](int i) { qlinear_matmul(ws[i % copies].w, x, y, n, nullptr, nullptr); }, 40);
            const double moved = bytes + 2.0 * n * (sh[0] + sh[1]);
            std::printf("%5dx%-6d %4d %-5s %2d %4d %9.2f %8.0f %6.1f%% %12.1f\n", sh[0], sh[1],
                        bits, asym ? "asym" : "sym", n, rows, ms * 1e3, moved / ms / 1e6,
                        100.0 * moved / ms / 1e6 / copy_gbs, n == 1 ? dq_ms * 1e3 : 0.0);
          }
          qlinear_detail::set_bits_rows(0);
        }
        CK(cudaGetLastError());
        for (auto& w : ws) CK(cudaFree(w.mem));
      }
    }
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
