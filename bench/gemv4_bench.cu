// 4-bit decode GEMV (n = 1..8) on the Llama-3-8B shapes: the register-fed kernel (round 2) and
// the register pipeline with x in shared memory (qlinear_gemv_stream.cu) over its depth and
// split-K settings.
// Build: bench/qlinear_device.sh. Weights are random bytes (speed only; correctness is in
// tests/test_cuda_gemv4.cc), rotated over > 300 MB so the numbers are DRAM numbers.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "backend/cuda/qlinear.h"

using namespace gyre;

#include "bench_common.cuh"

struct Cfg {
  int kernel, stage, depth, ksplit;
};

void set(const Cfg& c) {
  qlinear_detail::set_gemv_kernel(c.kernel);
  qlinear_detail::set_gemv_depth(c.depth);
  qlinear_detail::set_gemv_ksplit(c.ksplit);
}

int main(int argc, char** argv) {
  // Modes: (none) the sweep; quick: auto configs only; one ROWS COLS N KERNEL DEPTH KSPLIT: that
  // configuration only (for profilers).
  const bool sweep = argc < 2 || std::string_view(argv[1]) != "quick";
  const bool one = argc == 8 && std::string_view(argv[1]) == "one";
  const double copy_gbs = print_device_and_copy_gbs();

  const int shapes[][2] = {{4096, 4096},  {6144, 4096}, {14336, 4096}, {4096, 14336},
                           {28672, 4096}, {1024, 4096}, {128256, 4096}};
  __half *x, *y;
  CK(cudaMalloc(&x, 8 * 14336 * 2));
  CK(cudaMalloc(&y, 8 * 128256 * 2));
  fill_halves<<<256, 256>>>(x, 8 * 14336, -1.0f, 2.0f, 5);
  struct Summary {
    int rows, cols;
    double old_us[3], ring_us[3], best_us, best_n2 = 0, best_n8 = 0, pct_old, pct_ring[3], pct_best;
    Cfg best;
  };
  std::vector<Summary> summary;
  std::printf("\n%-14s %2s %12s %9s %8s %7s\n", "shape", "n", "kern/c/s/ks", "us", "GB/s", "%copy");
  for (const auto& sh0 : shapes) {
    int sh[2] = {sh0[0], sh0[1]};
    if (one) {
      if (&sh0 != &shapes[0]) break;
      sh[0] = std::atoi(argv[2]);
      sh[1] = std::atoi(argv[3]);
    }
    QWeightDesc d;
    d.bits = 4;
    d.group_size = 128;
    d.rows = sh[0];
    d.cols = sh[1];
    const double bytes = double(d.qweight_bytes()) + d.scale_count() * 2.0;
    const int copies = std::max(1, int(std::ceil(300e6 / bytes)));
    std::vector<Weight> ws;
    for (int c = 0; c < copies; ++c) ws.push_back(make_weight(d, 17 + c));
    CK(cudaDeviceSynchronize());
    auto run = [&](int n, const Cfg& c) {
      set(c);
      const float ms =
          time_ms([&](int i) { qlinear_gemv(ws[i % copies].w, x, y, n, nullptr, nullptr); }, 40, 7);
      const double moved = bytes + 2.0 * n * (sh[0] + sh[1]);
      const double pct = 100.0 * moved / ms / 1e6 / copy_gbs;
      std::printf("%6dx%-7d %2d %3d/%d/%d/%-3d %9.2f %8.0f %6.1f%%\n", sh[0], sh[1], n, c.kernel,
                  c.stage, c.depth, c.ksplit, ms * 1e3, moved / ms / 1e6, pct);
      return std::make_pair(ms * 1e3, pct);
    };
    if (one) {
      run(std::atoi(argv[4]), {std::atoi(argv[5]), 0, std::atoi(argv[6]), std::atoi(argv[7])});
      for (auto& w : ws) CK(cudaFree(w.mem));
      return 0;
    }
    Summary sm{};
    sm.rows = sh[0];
    sm.cols = sh[1];
    const int ns[3] = {1, 2, 8};
    // old = register-fed (auto split-K); ring slot = the register pipeline (kernel 4) at auto.
    for (int i = 0; i < 3; ++i) {
      auto o = run(ns[i], {1, 0, 0, 0});
      sm.old_us[i] = o.first;
      if (i == 0) sm.pct_old = o.second;
      auto r = run(ns[i], {4, 0, 0, 0});
      sm.ring_us[i] = r.first;
      sm.pct_ring[i] = r.second;
    }
    sm.best_us = sm.ring_us[0];
    sm.pct_best = sm.pct_ring[0];
    sm.best = {4, 0, 0, 0};
    if (sweep) {
      for (const int depth : {4, 8, 16}) {
        for (const int ks : {1, 2, 4, 8, 16}) {
          const Cfg c{4, 0, depth, ks};
          auto v = run(1, c);
          if (v.first < sm.best_us) {
            sm.best_us = v.first;
            sm.pct_best = v.second;
            sm.best = c;
          }
        }
      }
      for (const int depth : {4, 8})
        for (const int ks : {1, 2, 4, 8, 16}) run(8, {4, 0, depth, ks});
      sm.best_n2 = run(2, sm.best).first;
      sm.best_n8 = run(8, sm.best).first;
    }
    set({0, 0, 0, 0});
    summary.push_back(sm);
    for (auto& w : ws) CK(cudaFree(w.mem));
  }
  std::printf(
      "\nSUMMARY (us; %% of copy %.0f GB/s) old = register-fed (default), ring = register pipeline "
      "(kernel 4) auto; best = sweep (k/c/depth/ks)\n"
      "%-14s %14s %14s %8s %8s %8s %8s %20s %8s %8s\n",
      copy_gbs, "shape", "old n1", "ring n1", "old n2", "ring n2", "old n8", "ring n8",
      "best n1 (k/c/s/ks)", "best n2", "best n8");
  for (const Summary& m : summary) {
    std::printf(
        "%6dx%-7d %7.2f %5.1f%% %7.2f %5.1f%% %8.2f %8.2f %8.2f %8.2f %6.2f %4.1f%% %d/%d/%d/%-2d "
        "%8.2f %8.2f\n",
        m.rows, m.cols, m.old_us[0], m.pct_old, m.ring_us[0], m.pct_ring[0], m.old_us[1],
        m.ring_us[1], m.old_us[2], m.ring_us[2], m.best_us, m.pct_best, m.best.kernel, m.best.stage,
        m.best.depth, m.best.ksplit, m.best_n2, m.best_n8);
  }
  return 0;
}
