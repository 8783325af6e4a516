// Throughput of the quantized GEMV/GEMM on the Llama-3-8B shapes (build: bench/qlinear_device.sh).
// Weights are random bytes filled on the device (speed only; correctness is in the tests),
// rotated over enough copies to exceed the L2 cache so the numbers are DRAM numbers.
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

Weight make(int rows, int cols, int bits, int group, uint32_t seed) {
  QWeightDesc d;
  d.bits = bits;
  d.group_size = group;
  d.rows = rows;
  d.cols = cols;
  return make_weight(d, seed);
}

// `qlinear_bench bulk`: 4-bit serving batches only (round 4): the dispatched path, the round-3
// choice, the cp.async ("c") and register-fed ("r") kernels and the bulk-copy kernel's
// configurations ("b<config>/<split-K>", 0 = auto) on the six Llama-3-8B shapes.
void bench_bulk(__half* x, __half* y, double copy_gbs) {
  const int shapes[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336},
                           {1024, 4096}, {6144, 4096},  {28672, 4096}};
  std::printf("\nBULK (4-bit g128 sym)\n%-14s %3s %9s %9s %8s %7s\n", "shape", "n", "path", "us",
              "GB/s", "%copy");
  for (const auto& sh : shapes) {
    QWeightDesc d;
    d.bits = 4;
    d.group_size = 128;
    d.rows = sh[0];
    d.cols = sh[1];
    const double bytes = double(d.qweight_bytes()) + d.scale_count() * 2.0;
    const int copies = std::max(1, int(std::ceil(300e6 / bytes)));
    std::vector<Weight> ws;
    for (int c = 0; c < copies; ++c) ws.push_back(make(sh[0], sh[1], 4, 128, 31 + c));
    auto report = [&](int n, const char* path, float ms) {
      const double moved = bytes + 2.0 * n * (sh[0] + sh[1]);
      std::printf("%6dx%-7d %3d %9s %9.2f %8.0f %6.1f%%\n", sh[0], sh[1], n, path, ms * 1e3,
                  moved / ms / 1e6, 100.0 * moved / ms / 1e6 / copy_gbs);
    };
    auto batch = [&](int n) {
      return time_ms([&](int i) { qlinear_batch(ws[i % copies].w, x, y, n, nullptr, nullptr); },
                     40);
    };
    for (const int n : {9, 16, 32, 48, 64, 128}) {
      report(
          n, "matmul",
          time_ms([&](int i) { qlinear_matmul(ws[i % copies].w, x, y, n, nullptr, nullptr); }, 40));
      const int kernels[][2] = {{0, 'o'}, {3, 'c'}, {1, 'r'}};
      for (const auto& k : kernels) {
        qlinear_detail::set_batch_kernel(k[0]);
        char name[16];
        std::snprintf(name, sizeof name, "%s", k[1] == 'o' ? "auto" : k[1] == 'c' ? "c" : "r");
        report(n, name, batch(n));
      }
      qlinear_detail::set_batch_kernel(2);
      for (const int cfg : {0, 1, 3, 5, 6}) {
        for (const int ks : {0, 1, 2, 4, 8}) {
          for (const int prod : {0, 1, 2, 4}) {
            if ((cfg == 0 && ks != 0) || (cfg == 0) != (prod == 0)) continue;
            if ((n == 9 || n == 48 || n == 128) && cfg != 0) continue;
            qlinear_detail::set_batch_bulk_config(cfg, ks, prod);
            char name[24];
            std::snprintf(name, sizeof name, "b%d/%d/%d", cfg, ks, prod);
            report(n, name, batch(n));
          }
        }
      }
      qlinear_detail::set_batch_bulk_config(0, 0);
      qlinear_detail::set_batch_kernel(0);
    }
    CK(cudaGetLastError());
    for (auto& w : ws) CK(cudaFree(w.mem));
  }
}

// The LM head (128256x4096, 4-bit g128) at serving batch sizes: the dispatched path against
// every batch kernel forced, to choose the head's kernel at n = 9..128.
void bench_head(const __half* x, __half* y, double copy_gbs) {
  QWeightDesc d;
  d.bits = 4;
  d.group_size = 128;
  d.rows = 128256;
  d.cols = 4096;
  const double bytes = double(d.qweight_bytes()) + d.scale_count() * 2.0;
  const int copies = 2;
  std::vector<Weight> ws;
  for (int c = 0; c < copies; ++c) ws.push_back(make(d.rows, d.cols, 4, 128, 91 + c));
  std::printf(
      "\nHEAD 128256x4096 4-bit g128: kernel (0 dispatch, 1 register-fed, 2 bulk, 3 "
      "cp.async) / config / split-K\n");
  for (const int n : {16, 32, 64, 128}) {
    auto run = [&](int kernel, int cfg, int ks) {
      qlinear_detail::set_batch_kernel(kernel);
      qlinear_detail::set_batch_tiles_per_warp(0);
      qlinear_detail::set_batch_ksplit(0);
      qlinear_detail::set_batch4_ksplit(0);
      qlinear_detail::set_batch_bulk_config(0, 0);
      if (kernel == 1) qlinear_detail::set_batch_tiles_per_warp(cfg);
      if (kernel == 2) qlinear_detail::set_batch_bulk_config(cfg, ks);
      if (kernel == 3) {
        qlinear_detail::set_batch4_tiles_per_warp(cfg);
        qlinear_detail::set_batch4_ksplit(ks);
      }
      const float ms =
          time_ms([&](int i) { qlinear_matmul(ws[i % copies].w, x, y, n, nullptr, nullptr); }, 20);
      CK(cudaGetLastError());
      const double moved = bytes + 2.0 * n * (d.rows + d.cols);
      std::printf("n=%3d k%d cfg %2d ks %d %9.2f us %6.1f%%\n", n, kernel, cfg, ks, ms * 1e3,
                  100.0 * moved / ms / 1e6 / copy_gbs);
    };
    run(0, 0, 0);
    for (const int mt : {1, 2}) run(1, mt, 0);
    for (int cfg = 1; cfg <= 10; ++cfg) run(2, cfg, 0);
    for (const int mt : {1, 2})
      for (const int ks : {0, 1, 2}) run(3, mt, ks);
  }
  qlinear_detail::set_batch_kernel(0);
  qlinear_detail::set_batch_tiles_per_warp(0);
  qlinear_detail::set_batch4_tiles_per_warp(0);
  qlinear_detail::set_batch4_ksplit(0);
  qlinear_detail::set_batch_bulk_config(0, 0);
  for (auto& w : ws) CK(cudaFree(w.mem));
}

// `qlinear_bench bstream`: 4-bit serving batches (round 6): the round-5 dispatch ("old", kernel
// 6) against the stream batch kernel (qlinear_batch_stream.cu) at its automatic plan and forced
// tiles per warp / K-chunks, on the six Llama-3-8B shapes and the LM head at n = 16, 32, 64;
// then the layer sums (fused QKV + o + gate/up + down).
void bench_bstream(__half* x, __half* y, double copy_gbs) {
  const int shapes[][2] = {{6144, 4096}, {4096, 4096},  {28672, 4096}, {4096, 14336},
                           {1024, 4096}, {14336, 4096}, {128256, 4096}};
  const int ns[] = {16, 32, 64};
  double old_us[7][3] = {}, auto_us[7][3] = {}, best_us[7][3] = {}, pct[7][3][3] = {};
  int best_cfg[7][3][4] = {};
  std::printf(
      "\nBSTREAM (4-bit g128 sym): old = round-5 dispatch (kernel 6), dispatch = kernel 0, "
      "s<mt>/<ks>/<warps> = stream over the K-chunk grid, k<mt>/<blocks>/<warps> = stream-K\n");
  for (int si = 0; si < 7; ++si) {
    const auto& sh = shapes[si];
    QWeightDesc d;
    d.bits = 4;
    d.group_size = 128;
    d.rows = sh[0];
    d.cols = sh[1];
    const double bytes = double(d.qweight_bytes()) + d.scale_count() * 2.0;
    const int copies = std::max(2, int(std::ceil(300e6 / bytes)));
    std::vector<Weight> ws;
    for (int c = 0; c < copies; ++c) ws.push_back(make(sh[0], sh[1], 4, 128, 51 + c));
    for (int ni = 0; ni < 3; ++ni) {
      const int n = ns[ni];
      auto run = [&](int kernel, int mt, int ks, int warps, int sk) {
        qlinear_detail::set_batch_kernel(kernel);
        qlinear_detail::set_batch_stream_config(mt, ks, warps, sk);
        const float ms =
            time_ms([&](int i) { qlinear_batch(ws[i % copies].w, x, y, n, nullptr, nullptr); }, 40);
        CK(cudaGetLastError());
        const double moved = bytes + 2.0 * n * (sh[0] + sh[1]);
        const double p = 100.0 * moved / ms / 1e6 / copy_gbs;
        char name[24];
        if (kernel == 5 && sk >= 0)
          std::snprintf(name, sizeof name, "k%d/%d/%d", mt, sk, warps);
        else
          std::snprintf(name, sizeof name,
                        kernel == 6   ? "old"
                        : kernel == 0 ? "dispatch"
                                      : "s%d/%d/%d",
                        mt, ks, warps);
        std::printf("%6dx%-7d %3d %7s %9.2f %6.1f%%\n", sh[0], sh[1], n, name, ms * 1e3, p);
        return std::make_pair(ms * 1e3, p);
      };
      auto o = run(6, 0, 0, 0, -2);
      old_us[si][ni] = o.first;
      pct[si][ni][0] = o.second;
      auto a = run(0, 0, 0, 0, -1);  // the dispatch: stream kernel where preferred
      auto_us[si][ni] = best_us[si][ni] = a.first;
      pct[si][ni][1] = pct[si][ni][2] = a.second;
      for (const int warps : {8, 16}) {
        for (const int mt : {1, 2}) {
          for (const int ks : {0, 1, 2, 3, 4, 6, 8, 12, 16, -1000, -132, -264, -396}) {
            const int sk = ks < 0 ? -ks : -2;  // negative: stream-K with that many blocks
            auto v = run(5, mt, ks < 0 ? 0 : ks, warps, sk == 1000 ? 0 : sk);
            if (v.first < best_us[si][ni]) {
              best_us[si][ni] = v.first;
              pct[si][ni][2] = v.second;
              best_cfg[si][ni][0] = mt;
              best_cfg[si][ni][1] = ks;
              best_cfg[si][ni][2] = warps;
            }
          }
        }
      }
    }
    qlinear_detail::set_batch_kernel(0);
    qlinear_detail::set_batch_stream_config(0, 0, 0, -1);
    for (auto& w : ws) CK(cudaFree(w.mem));
  }
  std::printf(
      "\nBSTREAM SUMMARY (us, %% of copy %.0f GB/s): round-5 dispatch | dispatch now | stream "
      "best (mt/ks/warps; ks -B: stream-K over B blocks, -1000: auto)\n",
      copy_gbs);
  for (int si = 0; si < 7; ++si)
    for (int ni = 0; ni < 3; ++ni)
      std::printf("%6dx%-7d n=%2d  %8.2f %5.1f%% | %8.2f %5.1f%% | %8.2f %5.1f%% (%d/%d/%d)\n",
                  shapes[si][0], shapes[si][1], ns[ni], old_us[si][ni], pct[si][ni][0],
                  auto_us[si][ni], pct[si][ni][1], best_us[si][ni], pct[si][ni][2],
                  best_cfg[si][ni][0], best_cfg[si][ni][1], best_cfg[si][ni][2]);
  for (int ni = 0; ni < 3; ++ni) {
    double sum[3] = {};
    for (int si = 0; si < 4; ++si) {  // fused QKV, o, gate/up, down
      sum[0] += old_us[si][ni];
      sum[1] += auto_us[si][ni];
      sum[2] += std::min(old_us[si][ni], best_us[si][ni]);
    }
    std::printf(
        "LAYER n=%2d: round-5 dispatch %.1f us, dispatch now %.1f us, min(old, stream best) "
        "%.1f us\n",
        ns[ni], sum[0], sum[1], sum[2]);
  }
}

// `qlinear_bench bstream-one ROWS COLS N MT KS WARPS PARTITION`: one forced stream-kernel
// configuration (set_batch_stream_config arguments; kernel 6 = the round-5 dispatch when MT is
// -1), timed once, for profilers (ncu --kernel-name regex:bstream --launch-skip 10 ...).
void bench_bstream_one(char** argv, __half* x, __half* y, double copy_gbs) {
  const int rows = std::atoi(argv[2]), cols = std::atoi(argv[3]), n = std::atoi(argv[4]);
  const int mt = std::atoi(argv[5]), ks = std::atoi(argv[6]), warps = std::atoi(argv[7]);
  const int partition = std::atoi(argv[8]);
  QWeightDesc d;
  d.bits = 4;
  d.group_size = 128;
  d.rows = rows;
  d.cols = cols;
  const double bytes = double(d.qweight_bytes()) + d.scale_count() * 2.0;
  const int copies = std::max(2, int(std::ceil(300e6 / bytes)));
  std::vector<Weight> ws;
  for (int c = 0; c < copies; ++c) ws.push_back(make(rows, cols, 4, 128, 51 + c));
  qlinear_detail::set_batch_kernel(mt < 0 ? 6 : 5);
  qlinear_detail::set_batch_stream_config(std::max(mt, 0), ks, warps, partition);
  const float ms =
      time_ms([&](int i) { qlinear_batch(ws[i % copies].w, x, y, n, nullptr, nullptr); }, 40);
  CK(cudaGetLastError());
  const double moved = bytes + 2.0 * n * (rows + cols);
  std::printf("%dx%d n=%d mt %d ks %d warps %d partition %d: %.2f us, %.1f%% of copy\n", rows, cols,
              n, mt, ks, warps, partition, ms * 1e3, 100.0 * moved / ms / 1e6 / copy_gbs);
  qlinear_detail::set_batch_kernel(0);
  qlinear_detail::set_batch_stream_config(0, 0, 0, -1);
  for (auto& w : ws) CK(cudaFree(w.mem));
}

int main(int argc, char** argv) {
  const bool bulk_only = argc > 1 && std::string(argv[1]) == "bulk";
  const bool head_only = argc > 1 && std::string(argv[1]) == "head";
  const bool bstream_only = argc > 1 && std::string(argv[1]) == "bstream";
  const bool bstream_one = argc == 9 && std::string(argv[1]) == "bstream-one";
  const double copy_gbs = print_device_and_copy_gbs();

  // Llama-3-8B: q/o, gate/up, down, k/v, lm_head; then fused QKV and gate+up.
  const int shapes[][2] = {{4096, 4096},   {14336, 4096}, {4096, 14336}, {1024, 4096},
                           {128256, 4096}, {6144, 4096},  {28672, 4096}};
  const int n_gemm_shapes = 5;
  __half *x, *y;
  CK(cudaMalloc(&x, 2048 * 14336 * 2));
  CK(cudaMalloc(&y, 2048 * 128256 * 2));
  fill_halves<<<1024, 256>>>(x, 2048 * 14336, -1.0f, 2.0f, 5);
  if (head_only) {
    bench_head(x, y, copy_gbs);
    CK(cudaDeviceSynchronize());
    return 0;
  }
  if (bstream_one) {
    bench_bstream_one(argv, x, y, copy_gbs);
    CK(cudaDeviceSynchronize());
    return 0;
  }
  if (bstream_only) {
    bench_bstream(x, y, copy_gbs);
    CK(cudaDeviceSynchronize());
    return 0;
  }
  if (bulk_only) {
    bench_bulk(x, y, copy_gbs);
    CK(cudaDeviceSynchronize());
    return 0;
  }
  std::printf(
      "\nGEMV (g128 sym, f16 scales); 4-bit: cfg = ksplit/unroll (0 = auto: ksplit by tile count, "
      "unroll 2), 8-bit: rows\n"
      "%-14s %4s %2s %5s %9s %8s %7s\n",
      "shape", "bits", "n", "cfg", "us", "GB/s", "%copy");
  for (const auto& sh : shapes) {
    for (const int bits : {4, 8}) {
      QWeightDesc d;
      d.bits = bits;
      d.group_size = 128;
      d.rows = sh[0];
      d.cols = sh[1];
      const double bytes = double(d.qweight_bytes()) + d.scale_count() * 2.0;
      const int copies = std::max(1, int(std::ceil(300e6 / bytes)));
      std::vector<Weight> ws;
      for (int c = 0; c < copies; ++c) ws.push_back(make(sh[0], sh[1], bits, 128, 17 + c));
      auto run = [&](int n, const char* cfg) {
        const float ms =
            time_ms([&](int i) { qlinear_gemv(ws[i % copies].w, x, y, n, nullptr, nullptr); }, 40);
        const double moved = bytes + 2.0 * n * (sh[0] + sh[1]);
        std::printf("%6dx%-7d %4d %2d %5s %9.2f %8.0f %6.1f%%\n", sh[0], sh[1], bits, n, cfg,
                    ms * 1e3, moved / ms / 1e6, 100.0 * moved / ms / 1e6 / copy_gbs);
      };
      if (bits == 4) {
        const int cfgs[][2] = {{0, 0}, {0, 4}, {2, 2}, {4, 2}, {8, 2}, {16, 2}};
        for (const auto& c : cfgs) {
          qlinear_detail::set_gemv_ksplit(c[0]);
          qlinear_detail::set_gemv_unroll(c[1]);
          char name[16];
          std::snprintf(name, sizeof name, "%d/%d", c[0], c[1]);
          run(1, name);
        }
        qlinear_detail::set_gemv_ksplit(0);
        qlinear_detail::set_gemv_unroll(0);
        for (const int n : {2, 4, 8}) run(n, "auto");
      } else {
        for (const int n : {1, 8}) {
          qlinear_detail::set_gemv_rows_per_block(n == 1 ? 4 : 2);
          run(n, n == 1 ? "4" : "2");
        }
      }
      qlinear_detail::set_gemv_rows_per_block(0);
      CK(cudaGetLastError());
      for (auto& w : ws) CK(cudaFree(w.mem));
    }
  }

  // Serving batches: the dispatched path (qlinear_matmul) for n = 1..128, the batch kernel
  // forced at n = 1 and 8, a tiles-per-warp x split-K sweep, and the WMMA GEMM for comparison.
  std::printf(
      "\nBATCH (g128 sym); path: matmul = dispatched, batch mt/ks (0 = auto), gemm = WMMA\n"
      "%-14s %4s %3s %9s %9s %8s %7s\n",
      "shape", "bits", "n", "path", "us", "GB/s", "%copy");
  for (const auto& sh : shapes) {
    for (const int bits : {4, 8}) {
      QWeightDesc d;
      d.bits = bits;
      d.group_size = 128;
      d.rows = sh[0];
      d.cols = sh[1];
      if (sh[0] > 28672) continue;
      const double bytes = double(d.qweight_bytes()) + d.scale_count() * 2.0;
      const int copies = std::max(1, int(std::ceil(300e6 / bytes)));
      std::vector<Weight> ws;
      for (int c = 0; c < copies; ++c) ws.push_back(make(sh[0], sh[1], bits, 128, 31 + c));
      auto report = [&](int n, const char* path, float ms) {
        const double moved = bytes + 2.0 * n * (sh[0] + sh[1]);
        std::printf("%6dx%-7d %4d %3d %9s %9.2f %8.0f %6.1f%%\n", sh[0], sh[1], bits, n, path,
                    ms * 1e3, moved / ms / 1e6, 100.0 * moved / ms / 1e6 / copy_gbs);
      };
      for (const int n : {1, 4, 8, 16, 32, 64, 128}) {
        report(n, "matmul",
               time_ms([&](int i) { qlinear_matmul(ws[i % copies].w, x, y, n, nullptr, nullptr); },
                       40));
        // {kernel (0 auto, 1 register-fed), tiles per warp, split-K}; 4-bit auto = batch4.
        const int cfgs[][3] = {{1, 0, 0}, {1, 1, 0}, {1, 2, 0}, {1, 2, 2}, {0, 0, 0},
                               {0, 1, 0}, {0, 2, 0}, {0, 1, 1}, {0, 1, 2}, {0, 1, 4},
                               {0, 1, 8}, {0, 2, 1}, {0, 2, 2}, {0, 2, 4}, {0, 2, 8}};
        for (const auto& c : cfgs) {
          if (bits == 8 && c[0] == 0) continue;
          if (n <= 8 && c[1] == 2) continue;
          qlinear_detail::set_batch_kernel(c[0] == 0 ? 3 : c[0]);
          qlinear_detail::set_batch_tiles_per_warp(c[0] == 1 ? c[1] : 0);
          qlinear_detail::set_batch_ksplit(c[0] == 1 ? c[2] : 0);
          qlinear_detail::set_batch4_tiles_per_warp(c[0] == 0 ? c[1] : 0);
          qlinear_detail::set_batch4_ksplit(c[0] == 0 ? c[2] : 0);
          char name[16];
          std::snprintf(name, sizeof name, "%s%d/%d", c[0] == 0 ? "c" : "r", c[1], c[2]);
          report(n, name,
                 time_ms([&](int i) { qlinear_batch(ws[i % copies].w, x, y, n, nullptr, nullptr); },
                         40));
        }
        qlinear_detail::set_batch_kernel(0);
        qlinear_detail::set_batch_tiles_per_warp(0);
        qlinear_detail::set_batch_ksplit(0);
        qlinear_detail::set_batch4_tiles_per_warp(0);
        qlinear_detail::set_batch4_ksplit(0);
        if (n >= 16) {
          report(n, "gemm",
                 time_ms([&](int i) { qlinear_gemm(ws[i % copies].w, x, y, n, nullptr, nullptr); },
                         10));
        }
      }
      CK(cudaGetLastError());
      for (auto& w : ws) CK(cudaFree(w.mem));
    }
  }

  std::printf("\nGEMM n=2048 (g128 sym)\n%-14s %4s %9s %8s %12s\n", "shape", "bits", "us",
              "TFLOP/s", "dequant us");
  __half* deq;
  CK(cudaMalloc(&deq, size_t(14336) * 4096 * 2));
  for (int si = 0; si < n_gemm_shapes; ++si) {
    const auto& sh = shapes[si];
    if (sh[0] > 14336) continue;
    for (const int bits : {4, 8}) {
      Weight w = make(sh[0], sh[1], bits, 128, 99);
      const int n = 2048;
      const float ms = time_ms([&](int) { qlinear_gemm(w.w, x, y, n, nullptr, nullptr); }, 10);
      const float dq = time_ms([&](int) { qlinear_dequantize(w.w, deq, nullptr); }, 10);
      std::printf("%6dx%-7d %4d %9.1f %8.1f %12.1f\n", sh[0], sh[1], bits, ms * 1e3,
                  2.0 * n * sh[0] * sh[1] / ms / 1e9, dq * 1e3);
      CK(cudaFree(w.mem));
    }
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
