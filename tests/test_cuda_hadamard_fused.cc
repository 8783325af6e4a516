// Rotated layers whose decode GEMV rotates x in its shared-memory staging (qlinear_stream.cuh,
// qlinear_fuses_rotation): 4-bit at n = 1, 2 and the tiled 2/3/5/6/8-bit widths at n = 1, 2, 8,
// with and without the fused RMSNorm (norm, then rotate), B = 32, 64, 128, awkward row counts and
// a column count that leaves a half 64-column block. Each is checked against the unfused path
// (rmsnorm kernel -> hadamard_rotate -> the same GEMV on the unrotated weight view) and against a
// float64 CPU reference (explicit R^T x, rounded to FP16 once as the kernels round it, through
// the host dequantizer). Also: the stand-alone rotation kernel (warp and wide variants) against
// float64, the SwiGLU epilogue under a fused rotation, and the paths that must NOT rotate (4-bit
// at n = 8, act-order) leaving the caller's rotated x alone. Skipped without a GPU.
#include <gtest/gtest.h>

#ifdef GYRE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/hadamard.h"
#include "backend/cpu/qlinear_ref.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/hadamard_device.h"
#include "backend/cuda/qlinear.h"
#include "core/half.h"
#include "qlinear_test_util.h"

namespace gyre {
namespace {

using namespace qtest;

// Forces the fusion on for one test (the default may be off: qlinear.h), restored on exit.
struct FusedRotationOn {
  FusedRotationOn() { qlinear_detail::set_fused_rotation(1); }
  ~FusedRotationOn() { qlinear_detail::set_fused_rotation(-1); }
};

struct DeviceSigns {
  int8_t* p = nullptr;
  explicit DeviceSigns(const std::vector<int8_t>& s) {
    if (cudaMalloc(reinterpret_cast<void**>(&p), s.size()) == cudaSuccess)
      cudaMemcpy(p, s.data(), s.size(), cudaMemcpyHostToDevice);
  }
  ~DeviceSigns() { cudaFree(p); }
  DeviceSigns(const DeviceSigns&) = delete;
  DeviceSigns& operator=(const DeviceSigns&) = delete;
};

// R^T x per token in float64 from the definition: (R^T x)_i = sum_j R[j][i] x_j with
// R = diag(s) blockdiag(H_B), H_B[a][b] = (-1)^popcount(a & b) / sqrt(B).
std::vector<double> rotate_f64(const std::vector<uint16_t>& x, const HadamardRotation& r, int n,
                               int cols) {
  std::vector<double> y(size_t(n) * cols, 0.0);
  const double scale = 1.0 / std::sqrt(double(r.block));
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < cols; ++i) {
      const int b0 = i / r.block * r.block;
      double acc = 0;
      for (int j = b0; j < b0 + r.block; ++j) {
        const int parity = __builtin_popcount(unsigned((j - b0) & (i - b0))) & 1;
        acc += r.signs[j] * (parity ? -scale : scale) * f16_to_f32(x[size_t(t) * cols + j]);
      }
      y[size_t(t) * cols + i] = acc;
    }
  return y;
}

std::vector<uint16_t> to_halves(const std::vector<double>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_f16(static_cast<float>(v[i]));
  return h;
}

struct Width {
  int bits, group;
  bool asym;
};
const Width kWidths[] = {{4, 128, false}, {4, 32, true},  {2, 64, false},  {3, 128, false},
                         {5, 32, true},   {6, 64, false}, {8, 128, false}, {8, 32, true}};
const int kShapes[][2] = {{45, 384}, {300, 2560}, {130, 1056}};  // 1056: a half 64-block
constexpr int kMaxN = 8;
constexpr float kEps = 1e-5f;

QWeightHost random_weight(const Width& w, int rows, int cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.03f);
  std::vector<float> f(size_t(rows) * cols);
  for (float& v : f) v = nd(rng);
  return qweight_pack_from_f32(f.data(), rows, cols, w.bits, w.group, w.asym);
}

// |a - b| <= tol * mag elementwise (mag: the float64 reference's sum |x w|).
void expect_near_device(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want,
                        const std::vector<double>& mag, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = f16_to_f32(got[i]), w = f16_to_f32(want[i]);
    ASSERT_FALSE(std::isnan(g)) << "unwritten element " << i;
    ASSERT_LE(std::fabs(g - w), tol * mag[i] + 1e-6) << "element " << i;
  }
}

// The fused rotation (plain output with bias, and after the fused norm) vs the unfused path and
// float64, over widths, shapes, blocks and n.
TEST(CudaHadamardFused, GemvMatchesUnfusedAndFloat64) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const FusedRotationOn on;
  uint32_t seed = 9100;
  for (const Width& wd : kWidths)
    for (const auto& shape : kShapes) {
      const int rows = shape[0], cols = shape[1];
      if (cols % wd.group != 0) continue;
      const QWeightHost host = random_weight(wd, rows, cols, seed++);
      QWeightDevice plain = qweight_upload(host);
      const std::vector<uint16_t> xh = random_halves(size_t(kMaxN) * cols, 1.0f, seed++);
      const std::vector<uint16_t> bh = random_halves(rows, 0.5f, seed++);
      std::vector<uint16_t> nh = random_halves(cols, 0.5f, seed++);
      for (auto& v : nh) v = f32_to_f16(1.0f + f16_to_f32(v));  // norm weights around 1
      DeviceHalves x(xh.size()), bias(rows), norm(cols), normed(xh.size()), xr(xh.size());
      DeviceHalves y(size_t(kMaxN) * rows), y_ref(size_t(kMaxN) * rows);
      x.upload(xh);
      bias.upload(bh);
      norm.upload(nh);
      for (const int block : {32, 64, 128}) {
        if (cols % block != 0) continue;
        const HadamardRotation r{hadamard_random_signs(cols, seed++), block};
        DeviceSigns signs(r.signs);
        QWeightDevice rotated = plain;
        rotated.had_signs = signs.p;
        rotated.had_block = block;
        for (const bool with_norm : {false, true}) {
          // float64: normalised (rounded to FP16 as the kernels round it), rotated, rounded once.
          const std::vector<uint16_t> xin = with_norm ? rms_normed(xh, nh, kMaxN, cols, kEps) : xh;
          const Reference ref =
              reference(host, to_halves(rotate_f64(xin, r, kMaxN, cols)), &bh, kMaxN);
          for (const int n : {1, 2, 4, 8}) {
            const bool fused = qlinear_fuses_rotation(rotated, n);
            SCOPED_TRACE(std::to_string(wd.bits) + "-bit g" + std::to_string(wd.group) +
                         (wd.asym ? " asym" : "") + " [" + std::to_string(rows) + ", " +
                         std::to_string(cols) + "] B " + std::to_string(block) + " n " +
                         std::to_string(n) + (with_norm ? " norm" : "") +
                         (fused ? " fused" : " unfused"));
            // 2/3/5/6 bits: the stream GEMV to 4 rows, the serving-batch kernel (no rotation)
            // from 5.
            ASSERT_EQ(fused, wd.bits != 4 ? n <= 4 : n <= 2);
            // Unfused: rmsnorm kernel, rotation kernel, the GEMV on the unrotated view.
            const half* xin_d = x.p;
            if (with_norm) {
              cuda::rmsnorm(normed.p, nullptr, x.p, norm.p, n, cols, kEps, nullptr);
              xin_d = normed.p;
            }
            cuda::hadamard_rotate(xr.p, xin_d, signs.p, n, cols, block, nullptr);
            y_ref.poison();
            qlinear_matmul(plain, xr.p, y_ref.p, n, bias.p, nullptr);
            // Fused (or, where the GEMV cannot, the caller's rotated x: the kernels ignore the
            // signs then).
            QlinearFusion f;
            if (with_norm && fused) {
              f.norm_w = norm.p;
              f.norm_eps = kEps;
            }
            y.poison();
            qlinear_matmul(rotated, fused ? x.p : xr.p, y.p, n, bias.p, nullptr, f);
            CUDA_OK(cudaDeviceSynchronize());
            const size_t count = size_t(n) * rows;
            const std::vector<uint16_t> got = y.download(count), want = y_ref.download(count);
            const std::vector<double> mag(ref.mag.begin(), ref.mag.begin() + count);
            // Same staged values without the norm: the outputs agree to the bit. The fused norm
            // sums squares in another order than the rmsnorm kernel (an ulp of 1/rms at most);
            // the serving-batch kernel (narrow widths from 5 rows) adds split-K partials by
            // atomics, in no fixed order.
            const bool batch = wd.bits != 4 && n >= 5;
            if ((!with_norm || !fused) && !batch) {
              ASSERT_EQ(got, want);
            } else {
              expect_near_device(got, want, mag, 2e-3);
            }
            expect_close(got, {ref.y.begin(), ref.y.begin() + count}, mag);
            if (HasFatalFailure()) break;
          }
          if (HasFatalFailure()) break;
        }
        if (HasFatalFailure()) break;
      }
      qweight_free(plain);
      if (HasFatalFailure()) return;
    }
}

// The SwiGLU epilogue (gate/up interleaved by 8 rows; hidden 150: a partial 8-row block) under a
// fused norm and rotation vs the unfused path, and the residual add (y +=) without the norm.
TEST(CudaHadamardFused, SwigluAndAccumulateMatchUnfused) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const FusedRotationOn on;
  const int hidden = 150, rows = 2 * 152, cols = 2560;
  uint32_t seed = 9500;
  for (const Width& wd : {kWidths[0], kWidths[3], kWidths[5]}) {
    const QWeightHost host = random_weight(wd, rows, cols, seed++);
    QWeightDevice plain = qweight_upload(host);
    const HadamardRotation r{hadamard_random_signs(cols, seed++), 64};
    DeviceSigns signs(r.signs);
    QWeightDevice rotated = plain;
    rotated.had_signs = signs.p;
    rotated.had_block = r.block;
    const std::vector<uint16_t> xh = random_halves(size_t(kMaxN) * cols, 1.0f, seed++);
    const std::vector<uint16_t> nh = random_halves(cols, 1.0f, seed++);
    const std::vector<uint16_t> res = random_halves(size_t(kMaxN) * rows, 1.0f, seed++);
    DeviceHalves x(xh.size()), norm(cols), normed(xh.size()), xr(xh.size());
    DeviceHalves out(size_t(kMaxN) * hidden), out_ref(size_t(kMaxN) * hidden);
    DeviceHalves y(size_t(kMaxN) * rows), y_ref(size_t(kMaxN) * rows);
    x.upload(xh);
    norm.upload(nh);
    for (const int n : {1, 2, 8}) {
      if (!qlinear_fuses_rotation(rotated, n)) continue;
      SCOPED_TRACE(std::to_string(wd.bits) + "-bit n " + std::to_string(n));
      cuda::rmsnorm(normed.p, nullptr, x.p, norm.p, n, cols, kEps, nullptr);
      cuda::hadamard_rotate(xr.p, normed.p, signs.p, n, cols, r.block, nullptr);
      out_ref.poison();
      ASSERT_TRUE(qlinear_gemv_swiglu(plain, xr.p, out_ref.p, n, hidden, nullptr));
      QlinearFusion f;
      f.norm_w = norm.p;
      f.norm_eps = kEps;
      out.poison();
      ASSERT_TRUE(qlinear_gemv_swiglu(rotated, x.p, out.p, n, hidden, nullptr, f));
      CUDA_OK(cudaDeviceSynchronize());
      const size_t count = size_t(n) * hidden;
      const std::vector<uint16_t> got = out.download(count), want = out_ref.download(count);
      for (size_t i = 0; i < count; ++i) {
        const double g = f16_to_f32(got[i]), w = f16_to_f32(want[i]);
        ASSERT_FALSE(std::isnan(g)) << "unwritten element " << i;
        ASSERT_NEAR(g, w, 2e-3 * std::max(1.0, std::fabs(w))) << "element " << i;
      }
      // y += x . W: the rotation without the norm, bitwise as the unfused path.
      cuda::hadamard_rotate(xr.p, x.p, signs.p, n, cols, r.block, nullptr);
      y.upload(res);
      y_ref.upload(res);
      QlinearFusion acc;
      acc.accumulate = true;
      qlinear_matmul(plain, xr.p, y_ref.p, n, nullptr, nullptr, acc);
      qlinear_matmul(rotated, x.p, y.p, n, nullptr, nullptr, acc);
      CUDA_OK(cudaDeviceSynchronize());
      ASSERT_EQ(y.download(size_t(n) * rows), y_ref.download(size_t(n) * rows));
    }
    qweight_free(plain);
    if (HasFatalFailure()) return;
  }
}

// No fusion where the staging cannot rotate: act-order weights, blocks beyond the warp transform,
// 4-bit beyond n = 2, the narrow widths and tiled 8-bit beyond n = 4, and 8-bit weights in the
// host layout.
TEST(CudaHadamardFused, DeclinesWhereTheStagingCannotRotate) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const FusedRotationOn on;
  const int rows = 64, cols = 1024;
  std::vector<float> f(size_t(rows) * cols, 0.01f);
  std::vector<int32_t> perm(cols);
  for (int c = 0; c < cols; ++c) perm[c] = (c * 7) % cols;
  DeviceSigns signs(hadamard_random_signs(cols, 5));
  auto check = [&](const QWeightHost& host, int block, int n, bool want) {
    QWeightDevice w = qweight_upload(host);
    w.had_signs = signs.p;
    w.had_block = block;
    EXPECT_EQ(qlinear_fuses_rotation(w, n), want)
        << host.desc.bits << "-bit B " << block << " n " << n;
    qweight_free(w);
  };
  const QWeightHost q4 = qweight_pack_from_f32(f.data(), rows, cols, 4, 128, false);
  const QWeightHost q3 = qweight_pack_from_f32(f.data(), rows, cols, 3, 128, false);
  check(q4, 128, 1, true);
  check(q4, 128, 3, false);
  check(q4, 512, 1, false);
  check(q4, 0, 1, false);
  check(q3, 128, 4, true);
  check(q3, 128, 8, false);  // the serving-batch kernel from 5 rows, which does not rotate
  const QWeightHost q8 = qweight_pack_from_f32(f.data(), rows, cols, 8, 128, false);
  check(q8, 128, 1, true);  // tiled (the default)
  check(q8, 128, 8, false);
  qlinear_detail::set_bits8_stream(0);  // the host layout
  check(q8, 128, 1, false);
  qlinear_detail::set_bits8_stream(-1);
  check(qweight_pack_from_f32(f.data(), rows, cols, 4, 128, false, perm.data()), 128, 1, false);
  check(qweight_pack_from_f32(f.data(), rows, cols, 3, 128, false, perm.data()), 128, 1, false);
  qlinear_detail::set_fused_rotation(0);  // the A/B knob
  check(q3, 128, 1, false);
}

// The stand-alone rotation kernel: the warp version (B <= 256), the wide one (B = 512) and the
// unaligned fallback, against float64 R^T x.
TEST(CudaHadamardFused, RotationKernelMatchesFloat64) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int n = 5, cols = 1536;
  const std::vector<uint16_t> xh = random_halves(size_t(n) * cols + 8, 2.0f, 9900);
  DeviceHalves x(xh.size()), y(xh.size());
  x.upload(xh);
  for (const int block : {32, 64, 128, 256, 512})
    for (const int offset : {0, 1}) {  // 1: x and out 2 bytes past 16-byte alignment
      const HadamardRotation r{hadamard_random_signs(cols, block), block};
      DeviceSigns signs(r.signs);
      y.poison();
      cuda::hadamard_rotate(y.p + offset, x.p + offset, signs.p, n, cols, block, nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      const std::vector<uint16_t> all = y.download();
      const std::vector<uint16_t> xin(xh.begin() + offset, xh.begin() + offset + n * cols);
      const std::vector<double> want = rotate_f64(xin, r, n, cols);
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(f16_to_f32(all[i + offset]), want[i], 1e-3 * std::max(1.0, std::fabs(want[i])))
            << "block " << block << " offset " << offset << " at " << i;
    }
}

}  // namespace
}  // namespace gyre

#else
TEST(CudaHadamardFused, NotBuilt) {
  GTEST_SKIP() << "built without CUDA";
}
#endif
