// Quantized GEMV/GEMM/dequantization on the GPU against a float64 CPU reference built from the
// host dequantizer (qlinear_ref). Skipped when no GPU is present.
#include <gtest/gtest.h>

#ifdef GYRE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/qlinear_ref.h"
#include "backend/cuda/qlinear.h"
#include "core/error.h"
#include "core/half.h"
#include "qlinear_test_util.h"

namespace gyre {
namespace {

using qtest::DeviceHalves;
using qtest::have_gpu;

std::vector<float> random_floats(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

std::vector<uint16_t> to_halves(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_f16(v[i]);
  return h;
}

// Random GGUF blocks with finite f16 scale fields (any other bytes are valid).
std::vector<uint8_t> random_blocks(DType t, int rows, int cols, uint32_t seed) {
  const DTypeInfo& info = dtype_info(t);
  const size_t n_blocks = static_cast<size_t>(rows) * cols / info.block_elems;
  std::vector<uint8_t> b(n_blocks * info.block_bytes);
  std::mt19937 rng(seed);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(-0.002f, 0.002f);
  for (size_t i = 0; i < n_blocks; ++i) {
    uint8_t* blk = b.data() + i * info.block_bytes;
    const int at = t == DType::Q6_K ? 208 : 0;
    const uint16_t d = f32_to_f16(scale(rng)), m = f32_to_f16(scale(rng));
    std::memcpy(blk + at, &d, 2);
    if (t == DType::Q4_K || t == DType::Q5_K) std::memcpy(blk + 2, &m, 2);
  }
  return b;
}

struct Layout {
  std::string name;
  int bits, group;
  bool asym, perm;
  DType gguf;  // F32: round-to-nearest from floats
};

QWeightHost make_weight(const Layout& l, int rows, int cols, uint32_t seed) {
  if (l.gguf != DType::F32) {
    const std::vector<uint8_t> blocks = random_blocks(l.gguf, rows, cols, seed);
    return qweight_pack_from_gguf(l.gguf, blocks.data(), rows, cols);
  }
  const std::vector<float> w = random_floats(static_cast<size_t>(rows) * cols, 0.05f, seed);
  std::vector<int32_t> perm(cols);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed + 1));
  return qweight_pack_from_f32(w.data(), rows, cols, l.bits, l.group, l.asym,
                               l.perm ? perm.data() : nullptr);
}

// Checks y [n, rows] from the GPU against float64 x W^T + bias: every element written, the
// relative error norm under FP16 tolerance, each element within a bound from sum |x w|.
enum class Path { Gemv, Gemm, Batch };

void check_matmul(const QWeightHost& w, int n, Path path, uint32_t seed) {
  const int rows = w.desc.rows, cols = w.desc.cols;
  std::vector<float> wf(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r) qweight_dequantize_row(w, r, wf.data() + int64_t{r} * cols);
  const std::vector<uint16_t> xh = to_halves(random_floats(size_t(n) * cols, 1.0f, seed));
  const std::vector<uint16_t> bh = to_halves(random_floats(rows, 0.5f, seed + 7));

  QWeightDevice dw = qweight_upload(w);
  DeviceHalves x(size_t(n) * cols), y(size_t(n) * rows), bias(rows);
  x.upload(xh);
  bias.upload(bh);
  y.poison();
  if (path == Path::Gemm) {
    qlinear_gemm(dw, x.p, y.p, n, bias.p, nullptr);
  } else if (path == Path::Batch) {
    qlinear_batch(dw, x.p, y.p, n, bias.p, nullptr);
  } else {
    qlinear_gemv(dw, x.p, y.p, n, bias.p, nullptr);
  }
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint16_t> yh = y.download();
  qweight_free(dw);

  double err2 = 0, ref2 = 0;
  for (int t = 0; t < n; ++t) {
    for (int r = 0; r < rows; ++r) {
      double ref = f16_to_f32(bh[r]), mag = std::fabs(ref);
      for (int c = 0; c < cols; ++c) {
        const double p = double(f16_to_f32(xh[size_t(t) * cols + c])) * wf[size_t(r) * cols + c];
        ref += p;
        mag += std::fabs(p);
      }
      const double got = f16_to_f32(yh[size_t(t) * rows + r]);
      ASSERT_FALSE(std::isnan(got)) << "unwritten y[" << t << ", " << r << "]";
      ASSERT_NEAR(got, ref, 4e-3 * mag + 1e-3 * std::fabs(ref) + 1e-6)
          << "y[" << t << ", " << r << "]";
      err2 += (got - ref) * (got - ref);
      ref2 += ref * ref;
    }
  }
  // The norm criterion needs enough outputs; a single output can be a near-cancellation.
  if (n * rows >= 64) {
    EXPECT_LT(std::sqrt(err2 / ref2), 2e-3);
  }
}

const Layout kLayouts[] = {
    {"q4_g128_sym", 4, 128, false, false, DType::F32},
    {"q4_g32_asym_perm", 4, 32, true, true, DType::F32},
    {"q8_g64_sym", 8, 64, false, false, DType::F32},
    {"q8_g128_asym_perm", 8, 128, true, true, DType::F32},
    {"gguf_q4_0", 4, 32, false, false, DType::Q4_0},
    {"gguf_q4_k", 4, 32, true, false, DType::Q4_K},
    {"gguf_q6_k", 8, 16, false, false, DType::Q6_K},
};

TEST(CudaQlinear, GemvMatchesFloat64) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int shapes[][2] = {{1, 256}, {17, 512}, {4104, 1024}};
  uint32_t seed = 1;
  for (const Layout& l : kLayouts) {
    for (const auto& s : shapes) {
      const QWeightHost w = make_weight(l, s[0], s[1], seed++);
      for (int n = 1; n <= 8; ++n) {
        SCOPED_TRACE(l.name + " rows " + std::to_string(s[0]) + " n " + std::to_string(n));
        check_matmul(w, n, Path::Gemv, seed++);
      }
    }
  }
}

// 4-bit tiles are 16 rows x 64 columns: a fused (row-concatenated) weight whose parts and total
// are not multiples of 16 rows, with 160 columns (a padded half block at group 32).
TEST(CudaQlinear, FusedPaddedWeightMatchesFloat64) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Layout layouts[] = {
      {"q4_g32_sym", 4, 32, false, false, DType::F32},
      {"q4_g32_asym_perm", 4, 32, true, true, DType::F32},
      {"gguf_q4_0", 4, 32, false, false, DType::Q4_0},
      {"q8_g32_sym", 8, 32, false, false, DType::F32},
  };
  uint32_t seed = 900;
  for (const Layout& l : layouts) {
    // One seed for all parts: a fused act-order weight needs one column permutation.
    std::vector<QWeightHost> parts;
    for (const int rows : {21, 8, 35}) parts.push_back(make_weight(l, rows, 160, seed));
    ++seed;
    const QWeightHost fused = qweight_concat_rows({&parts[0], &parts[1], &parts[2]});
    for (const int n : {1, 3, 8}) {
      SCOPED_TRACE(l.name + " n " + std::to_string(n));
      check_matmul(fused, n, Path::Gemv, seed++);
    }
    for (const int n : {1, 40, 100}) {
      SCOPED_TRACE(l.name + " batch n " + std::to_string(n));
      check_matmul(fused, n, Path::Batch, seed++);
    }
    SCOPED_TRACE(l.name + " gemm");
    check_matmul(fused, 40, Path::Gemm, seed++);
  }
}

TEST(CudaQlinear, GemmMatchesFloat64) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 100;
  for (const Layout& l : kLayouts) {
    for (const int rows : {17, 300}) {
      const QWeightHost w = make_weight(l, rows, 512, seed++);
      for (const int n : {1, 33, 512}) {
        SCOPED_TRACE(l.name + " rows " + std::to_string(rows) + " n " + std::to_string(n));
        check_matmul(w, n, Path::Gemm, seed++);
      }
    }
  }
}

// float64 y [n, rows] = x W^T + bias for the first n rows of x [*, cols].
std::vector<double> reference_matmul(const QWeightHost& w, const std::vector<uint16_t>& xh,
                                     const std::vector<uint16_t>& bh, int n,
                                     std::vector<double>* magnitude) {
  const int rows = w.desc.rows, cols = w.desc.cols;
  std::vector<float> wrow(cols);
  std::vector<double> xd(size_t(n) * cols);
  for (size_t i = 0; i < xd.size(); ++i) xd[i] = f16_to_f32(xh[i]);
  std::vector<double> y(size_t(n) * rows);
  magnitude->assign(y.size(), 0.0);
  for (int r = 0; r < rows; ++r) {
    qweight_dequantize_row(w, r, wrow.data());
    for (int t = 0; t < n; ++t) {
      double acc = f16_to_f32(bh[r]), mag = std::fabs(acc);
      const double* xr = xd.data() + size_t(t) * cols;
      for (int c = 0; c < cols; ++c) {
        const double p = xr[c] * wrow[c];
        acc += p;
        mag += std::fabs(p);
      }
      y[size_t(t) * rows + r] = acc;
      (*magnitude)[size_t(t) * rows + r] = mag;
    }
  }
  return y;
}

// got [n, width] (FP16) against ref: every element written, within FP16 tolerance.
void expect_close(const std::vector<uint16_t>& got, const std::vector<double>& ref,
                  const std::vector<double>& mag) {
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

void set_batch_config(int kernel, int tiles_per_warp, int ksplit) {
  qlinear_detail::set_batch_kernel(kernel);
  qlinear_detail::set_batch_tiles_per_warp(kernel == 1 ? tiles_per_warp : 0);
  qlinear_detail::set_batch_ksplit(kernel == 1 ? ksplit : 0);
  qlinear_detail::set_batch4_tiles_per_warp(kernel == 0 ? tiles_per_warp : 0);
  qlinear_detail::set_batch4_ksplit(kernel == 0 ? ksplit : 0);
}

// The batch kernel (n = 1..128) for every layout, awkward row counts, column counts that leave
// a partial 64-column block or few blocks per split-K warp, every n8-tile count and two token
// groups, under the automatic choice and forced tiles-per-warp / split-K settings.
TEST(CudaQlinear, BatchMatchesFloat64) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Layout layouts[] = {
      {"q4_g128_sym", 4, 128, false, false, DType::F32},
      {"q4_g32_asym_perm", 4, 32, true, true, DType::F32},
      {"q4_g64_asym", 4, 64, true, false, DType::F32},
      {"q8_g64_sym", 8, 64, false, false, DType::F32},
      {"q8_g128_asym_perm", 8, 128, true, true, DType::F32},
      {"gguf_q4_k", 4, 32, true, false, DType::Q4_K},
      {"gguf_q6_k", 8, 16, false, false, DType::Q6_K},
      {"gguf_q8_0", 8, 32, false, false, DType::Q8_0},
  };
  const int shapes[][2] = {{17, 1280}, {300, 768}, {45, 2560}};
  const int ns[] = {1, 3, 8, 9, 16, 17, 31, 32, 33, 64, 65, 128};
  // kernel (0: auto, 4-bit -> qlinear_batch4.cu; 1: register-fed), tiles per warp, split-K
  const int configs[][3] = {{0, 0, 0}, {0, 1, 8}, {0, 2, 2}, {1, 0, 0},
                            {1, 2, 1}, {1, 2, 8}, {1, 1, 4}};
  constexpr int kMaxN = 128;
  uint32_t seed = 2000;
  for (const Layout& l : layouts) {
    for (const auto& s : shapes) {
      const QWeightHost w = make_weight(l, s[0], s[1], seed++);
      const int rows = w.desc.rows, cols = w.desc.cols;
      const std::vector<uint16_t> xh = to_halves(random_floats(size_t(kMaxN) * cols, 1.0f, seed++));
      const std::vector<uint16_t> bh = to_halves(random_floats(rows, 0.5f, seed++));
      std::vector<double> mag;
      const std::vector<double> ref_all = reference_matmul(w, xh, bh, kMaxN, &mag);
      QWeightDevice dw = qweight_upload(w);
      DeviceHalves x(size_t(kMaxN) * cols), y(size_t(kMaxN) * rows), bias(rows);
      x.upload(xh);
      bias.upload(bh);
      for (const auto& cfg : configs) {
        set_batch_config(cfg[0], cfg[1], cfg[2]);
        for (const int n : ns) {
          SCOPED_TRACE(l.name + " rows " + std::to_string(rows) + " cols " + std::to_string(cols) +
                       " n " + std::to_string(n) + " cfg " + std::to_string(cfg[0]) + "/" +
                       std::to_string(cfg[1]));
          y.poison();
          qlinear_batch(dw, x.p, y.p, n, bias.p, nullptr);
          CUDA_OK(cudaDeviceSynchronize());
          std::vector<uint16_t> got = y.download();
          got.resize(size_t(n) * rows);
          const std::vector<double> ref(ref_all.begin(), ref_all.begin() + size_t(n) * rows);
          const std::vector<double> m(mag.begin(), mag.begin() + size_t(n) * rows);
          expect_close(got, ref, m);
          if (HasFatalFailure()) break;
        }
      }
      set_batch_config(0, 0, 0);
      qweight_free(dw);
      if (HasFatalFailure()) return;
    }
  }
}

// The bulk-copy batch kernel (qlinear_batch_bulk.cu) forced for every configuration and split-K:
// 4-bit layouts without act-order (f16 and f32 scales, sym and asym, groups 32/64/128), row
// counts that leave partial 16-row tiles and partial blocks of tiles, a half 64-column block
// (160 columns at group 32), k-ranges that do not divide into whole stages, n across the
// 8/16/32/64-token tile shapes and two token groups.
TEST(CudaQlinear, BatchBulkMatchesFloat64) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Layout layouts[] = {
      {"q4_g128_sym", 4, 128, false, false, DType::F32},
      {"q4_g64_asym", 4, 64, true, false, DType::F32},
      {"q4_g32_sym", 4, 32, false, false, DType::F32},
      {"gguf_q4_0", 4, 32, false, false, DType::Q4_0},
      {"gguf_q4_k", 4, 32, true, false, DType::Q4_K},
  };
  const int shapes[][2] = {{17, 1280}, {300, 768}, {45, 2560}, {200, 160}};
  const int ns[] = {9, 17, 33, 63, 64, 100};
  // {configuration, split-K, producer warps}; 0 = automatic.
  const int configs[][3] = {{0, 0, 0}, {1, 1, 1}, {1, 8, 4}, {2, 2, 2}, {3, 0, 3},
                            {4, 4, 1}, {5, 0, 4}, {5, 2, 2}, {6, 1, 1}, {7, 8, 4},
                            {8, 0, 2}, {9, 2, 4}, {10, 4, 1}};
  constexpr int kMaxN = 100;
  uint32_t seed = 2500;
  for (const Layout& l : layouts) {
    for (const auto& s : shapes) {
      if (s[1] % 256 != 0 && (l.group != 32 || l.gguf == DType::Q4_K)) continue;
      const QWeightHost w = make_weight(l, s[0], s[1], seed++);
      const int rows = w.desc.rows, cols = w.desc.cols;
      const std::vector<uint16_t> xh = to_halves(random_floats(size_t(kMaxN) * cols, 1.0f, seed++));
      const std::vector<uint16_t> bh = to_halves(random_floats(rows, 0.5f, seed++));
      std::vector<double> mag;
      const std::vector<double> ref_all = reference_matmul(w, xh, bh, kMaxN, &mag);
      QWeightDevice dw = qweight_upload(w);
      DeviceHalves x(size_t(kMaxN) * cols), y(size_t(kMaxN) * rows), bias(rows);
      x.upload(xh);
      bias.upload(bh);
      qlinear_detail::set_batch_kernel(2);
      for (const auto& cfg : configs) {
        qlinear_detail::set_batch_bulk_config(cfg[0], cfg[1], cfg[2]);
        for (const int n : ns) {
          SCOPED_TRACE(l.name + " rows " + std::to_string(rows) + " cols " + std::to_string(cols) +
                       " n " + std::to_string(n) + " bulk cfg " + std::to_string(cfg[0]) + "/" +
                       std::to_string(cfg[1]) + "/" + std::to_string(cfg[2]));
          y.poison();
          qlinear_batch(dw, x.p, y.p, n, bias.p, nullptr);
          CUDA_OK(cudaDeviceSynchronize());
          std::vector<uint16_t> got = y.download();
          got.resize(size_t(n) * rows);
          const std::vector<double> ref(ref_all.begin(), ref_all.begin() + size_t(n) * rows);
          const std::vector<double> m(mag.begin(), mag.begin() + size_t(n) * rows);
          expect_close(got, ref, m);
          if (HasFatalFailure()) break;
        }
      }
      qlinear_detail::set_batch_bulk_config(0, 0);
      qlinear_detail::set_batch_kernel(0);
      qweight_free(dw);
      if (HasFatalFailure()) return;
    }
  }
}

// SwiGLU epilogue of the batch kernel (4- and 8-bit) and the split output through
// qlinear_matmul_split, against float64.
TEST(CudaQlinear, BatchSwigluAndSplitMatchFloat64) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Layout layouts[] = {
      {"q4_g32_asym_perm", 4, 32, true, true, DType::F32},
      {"q4_g64_sym", 4, 64, false, false, DType::F32},  // n 9..64: the bulk-copy kernel
      {"q8_g64_sym", 8, 64, false, false, DType::F32},
  };
  const int hidden = 37, rows = 2 * 40, cols = 512, n_max = 100;
  uint32_t seed = 3000;
  for (const Layout& l : layouts) {
    const QWeightHost w = make_weight(l, rows, cols, seed++);
    const std::vector<uint16_t> xh = to_halves(random_floats(size_t(n_max) * cols, 1.0f, seed++));
    const std::vector<uint16_t> zero(rows, 0);
    std::vector<double> mag;
    const std::vector<double> y = reference_matmul(w, xh, zero, n_max, &mag);
    QWeightDevice dw = qweight_upload(w);
    DeviceHalves x(size_t(n_max) * cols), out(size_t(n_max) * rows);
    x.upload(xh);
    for (const int n : {5, 20, 33, 63, 100}) {
      SCOPED_TRACE(l.name + " n " + std::to_string(n));
      out.poison();
      ASSERT_TRUE(qlinear_gemv_swiglu(dw, x.p, out.p, n, hidden, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      std::vector<uint16_t> got = out.download();
      got.resize(size_t(n) * hidden);
      std::vector<double> ref(size_t(n) * hidden), m(ref.size());
      for (int t = 0; t < n; ++t) {
        for (int h = 0; h < hidden; ++h) {
          // Rows [16b, 16b + 8) are gate rows 8b.., the next 8 the matching up rows.
          const size_t gi = size_t(t) * rows + 16 * (h / 8) + h % 8, ui = gi + 8;
          const double gate = y[gi], up = y[ui];
          const double silu = gate / (1.0 + std::exp(-gate));
          ref[size_t(t) * hidden + h] = silu * up;
          m[size_t(t) * hidden + h] = std::fabs(silu) * mag[ui] + mag[gi] * std::fabs(up);
        }
      }
      expect_close(got, ref, m);

      // The same weight as three outputs of 30, 7 and 43 rows.
      DeviceHalves a(size_t(n) * 30), b(size_t(n) * 7), c(size_t(n) * 43);
      a.poison();
      b.poison();
      c.poison();
      cuda::OutSplit split;
      split.out[0] = a.p;
      split.out[1] = b.p;
      split.out[2] = c.p;
      split.end[0] = 30;
      split.end[1] = 37;
      split.end[2] = rows;
      split.parts = 3;
      qlinear_matmul_split(dw, x.p, split, n, nullptr, nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      const std::vector<uint16_t> parts[3] = {a.download(), b.download(), c.download()};
      std::vector<uint16_t> joined(size_t(n) * rows);
      int start = 0;
      for (int pi = 0; pi < 3; ++pi) {
        const int width = split.end[pi] - start;
        for (int t = 0; t < n; ++t)
          for (int r = 0; r < width; ++r)
            joined[size_t(t) * rows + start + r] = parts[pi][size_t(t) * width + r];
        start = split.end[pi];
      }
      expect_close(joined, std::vector<double>(y.begin(), y.begin() + size_t(n) * rows),
                   std::vector<double>(mag.begin(), mag.begin() + size_t(n) * rows));
    }
    qweight_free(dw);
  }
}

TEST(CudaQlinear, DequantizeMatchesHostReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 500;
  for (const Layout& l : kLayouts) {
    SCOPED_TRACE(l.name);
    const int rows = 33, cols = 512;
    const QWeightHost w = make_weight(l, rows, cols, seed++);
    QWeightDevice dw = qweight_upload(w);
    DeviceHalves out(size_t(rows) * cols);
    out.poison();
    qlinear_dequantize(dw, out.p, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<uint16_t> got = out.download();
    qweight_free(dw);
    std::vector<float> ref(cols);
    for (int r = 0; r < rows; ++r) {
      qweight_dequantize_row(w, r, ref.data());
      float row_max = 0;
      for (float v : ref) row_max = std::max(row_max, std::fabs(v));
      for (int c = 0; c < cols; ++c) {
        // FP16 arithmetic on the GPU: within one FP16 rounding of the exact value, plus the
        // rounding of f32 scales to f16 for the K-quant repacks.
        const float g = f16_to_f32(got[size_t(r) * cols + c]);
        ASSERT_NEAR(g, ref[c], std::fabs(ref[c]) * 2e-3 + row_max * 1e-3 + 1e-6)
            << "r " << r << " c " << c;
      }
    }
  }
}

TEST(CudaQlinear, RejectsBadArguments) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const QWeightHost w = make_weight(kLayouts[0], 4, 128, 9);
  QWeightDevice dw = qweight_upload(w);
  DeviceHalves x(16 * 128 + 8), y(16 * 4);
  EXPECT_THROW(qlinear_gemv(dw, x.p, y.p, 9, nullptr, nullptr), Error);
  EXPECT_THROW(qlinear_gemv(dw, x.p, y.p, 0, nullptr, nullptr), Error);
  EXPECT_THROW(qlinear_gemv(dw, x.p + 1, y.p, 1, nullptr, nullptr), Error);  // misaligned
  EXPECT_THROW(qlinear_batch(dw, x.p, y.p, 0, nullptr, nullptr), Error);
  EXPECT_THROW(qlinear_batch(dw, x.p, y.p, kQlinearBatchMaxRows + 1, nullptr, nullptr), Error);
  qweight_free(dw);
  EXPECT_THROW(qlinear_gemv(dw, x.p, y.p, 1, nullptr, nullptr), Error);  // freed
}

}  // namespace
}  // namespace gyre

#else
TEST(CudaQlinear, NotBuilt) {
  GTEST_SKIP() << "built without CUDA";
}
#endif
