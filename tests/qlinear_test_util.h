// Test scaffolding shared by the CUDA quantized-matmul tests (test_cuda_qlinear.cc,
// test_cuda_gemv4.cc, test_cuda_qlinear_bstream.cc): device buffers of halves, random 4-bit
// weights (round-to-nearest from floats or random GGUF blocks), and the float64 reference built
// from the host dequantizer (qlinear_ref) with its FP16 error scale. Include inside
// #ifdef GYRE_HAVE_CUDA.
#pragma once
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/qlinear_ref.h"
#include "backend/cuda/test_hooks.h"
#include "core/half.h"

namespace gyre::qtest {

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// Runs f on scope exit: a test's knob reset even when an assertion returns early.
template <class F>
struct AtExit {
  explicit AtExit(F fn) : f(std::move(fn)) {}
  AtExit(const AtExit&) = delete;
  AtExit& operator=(const AtExit&) = delete;
  ~AtExit() { f(); }
  F f;
};

// A device buffer of `n` halves, freed on scope exit.
struct DeviceHalves {
  __half* p = nullptr;
  size_t n = 0;
  explicit DeviceHalves(size_t count) : n(count) {
    if (cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(count, 1) * 2) != cudaSuccess)
      p = nullptr;
  }
  ~DeviceHalves() { cudaFree(p); }
  DeviceHalves(const DeviceHalves&) = delete;
  DeviceHalves& operator=(const DeviceHalves&) = delete;
  void upload(const std::vector<uint16_t>& h) {
    cudaMemcpy(p, h.data(), std::min(h.size(), n) * 2, cudaMemcpyHostToDevice);
  }
  std::vector<uint16_t> download(size_t count) const {
    std::vector<uint16_t> h(count);
    cudaMemcpy(h.data(), p, count * 2, cudaMemcpyDeviceToHost);
    return h;
  }
  std::vector<uint16_t> download() const { return download(n); }
  // The output, and every SM's shared memory, to NaN (0xffff in FP16): a result the kernel did
  // not write, or one computed from a shared-memory slot read before its copy landed, shows.
  void poison() {
    cudaMemset(p, 0xff, n * 2);
    qlinear_detail::poison_shared_memory();
  }
};

inline std::vector<uint16_t> random_halves(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<uint16_t> h(n);
  for (auto& v : h) v = f32_to_f16(u(rng));
  return h;
}

// RMSNorm of `tokens` rows of x (halves) times the norm weight, rounded to FP16 the way the
// fused-norm kernels round it: the input the plain reference sees for a fused-norm GEMV.
inline std::vector<uint16_t> rms_normed(const std::vector<uint16_t>& x,
                                        const std::vector<uint16_t>& norm_w, int tokens, int cols,
                                        double eps) {
  std::vector<uint16_t> out(x.size());
  for (int t = 0; t < tokens; ++t) {
    double ss = 0;
    for (int c = 0; c < cols; ++c) ss += std::pow(f16_to_f32(x[size_t(t) * cols + c]), 2);
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / cols + eps));
    for (int c = 0; c < cols; ++c)
      out[size_t(t) * cols + c] =
          f32_to_f16(f16_to_f32(x[size_t(t) * cols + c]) * inv * f16_to_f32(norm_w[c]));
  }
  return out;
}

// A layout under test: from floats (gguf F32) with this group / symmetry / act-order (4 bits
// unless make_weight is told otherwise), or random blocks of a GGUF type.
struct Layout {
  std::string name;
  int group;
  bool asym, perm;
  DType gguf;
};

inline QWeightHost make_weight(const Layout& l, int rows, int cols, uint32_t seed, int bits = 4) {
  std::mt19937 rng(seed);
  if (l.gguf != DType::F32) {
    // Random GGUF blocks with small finite f16 scale (and min) fields.
    const DTypeInfo& info = dtype_info(l.gguf);
    const size_t blocks = size_t(rows) * cols / info.block_elems;
    std::vector<uint8_t> b(blocks * info.block_bytes);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    std::uniform_real_distribution<float> scale(-0.002f, 0.002f);
    for (size_t i = 0; i < blocks; ++i) {
      const uint16_t d = f32_to_f16(scale(rng)), m = f32_to_f16(scale(rng));
      std::memcpy(b.data() + i * info.block_bytes, &d, 2);
      if (l.gguf == DType::Q4_K) std::memcpy(b.data() + i * info.block_bytes + 2, &m, 2);
    }
    return qweight_pack_from_gguf(l.gguf, b.data(), rows, cols);
  }
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  std::vector<float> w(size_t(rows) * cols);
  for (float& v : w) v = u(rng);
  std::vector<int32_t> perm(cols);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  return qweight_pack_from_f32(w.data(), rows, cols, bits, l.group, l.asym,
                               l.perm ? perm.data() : nullptr);
}

// float64 y [n, rows] = x W^T (+ bias) and sum |x w| per element (the FP16 error scale).
struct Reference {
  std::vector<double> y, mag;
};

inline Reference reference(const QWeightHost& w, const std::vector<uint16_t>& x,
                           const std::vector<uint16_t>* bias, int n) {
  const int rows = w.desc.rows, cols = w.desc.cols;
  Reference r;
  r.y.assign(size_t(n) * rows, 0.0);
  r.mag.assign(r.y.size(), 0.0);
  std::vector<float> wrow(cols);
  for (int row = 0; row < rows; ++row) {
    qweight_dequantize_row(w, row, wrow.data());
    for (int t = 0; t < n; ++t) {
      double acc = bias ? f16_to_f32((*bias)[row]) : 0.0, mag = std::fabs(acc);
      for (int c = 0; c < cols; ++c) {
        const double p = double(f16_to_f32(x[size_t(t) * cols + c])) * wrow[c];
        acc += p;
        mag += std::fabs(p);
      }
      r.y[size_t(t) * rows + row] = acc;
      r.mag[size_t(t) * rows + row] = mag;
    }
  }
  return r;
}

// A backend's float results against the reference: every element within 5e-3 of its error
// scale (+1e-3), the whole within 3e-3 relative L2.
inline void expect_backend_close(const std::vector<float>& got, const Reference& ref) {
  ASSERT_EQ(got.size(), ref.y.size());
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < ref.y.size(); ++i) {
    ASSERT_NEAR(got[i], ref.y[i], 5e-3 * ref.mag[i] + 1e-3) << "element " << i;
    err2 += (got[i] - ref.y[i]) * (got[i] - ref.y[i]);
    ref2 += ref.y[i] * ref.y[i];
  }
  EXPECT_LT(std::sqrt(err2 / ref2), 3e-3);
}

inline void expect_close(const std::vector<uint16_t>& got, const std::vector<double>& ref,
                         const std::vector<double>& mag) {
  ASSERT_EQ(got.size(), ref.size());
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = f16_to_f32(got[i]);
    ASSERT_FALSE(std::isnan(g)) << "unwritten element " << i;
    ASSERT_NEAR(g, ref[i], 4e-3 * mag[i] + 1e-3 * std::fabs(ref[i]) + 1e-6) << "element " << i;
    err2 += (g - ref[i]) * (g - ref[i]);
    ref2 += ref[i] * ref[i];
  }
  if (ref.size() >= 64) {
    EXPECT_LT(std::sqrt(err2 / ref2), 2e-3);
  }
}

}  // namespace gyre::qtest
