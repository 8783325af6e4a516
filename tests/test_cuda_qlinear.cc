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

namespace gyre {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// A device buffer of halves, freed on scope exit.
struct DeviceHalves {
  __half* p = nullptr;
  size_t n = 0;
  explicit DeviceHalves(size_t count) : n(count) {
    if (cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(count, 1) * 2) != cudaSuccess)
      p = nullptr;
  }
  ~DeviceHalves() { cudaFree(p); }
  void upload(const std::vector<uint16_t>& h) {
    cudaMemcpy(p, h.data(), n * 2, cudaMemcpyHostToDevice);
  }
  std::vector<uint16_t> download() const {
    std::vector<uint16_t> h(n);
    cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost);
    return h;
  }
  void poison() { cudaMemset(p, 0xff, n * 2); }  // 0xffff is a NaN in FP16
};

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
void check_matmul(const QWeightHost& w, int n, bool use_gemm, uint32_t seed) {
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
  if (use_gemm) {
    qlinear_gemm(dw, x.p, y.p, n, bias.p, nullptr);
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
        check_matmul(w, n, false, seed++);
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
      check_matmul(fused, n, false, seed++);
    }
    SCOPED_TRACE(l.name + " gemm");
    check_matmul(fused, 40, true, seed++);
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
        check_matmul(w, n, true, seed++);
      }
    }
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
