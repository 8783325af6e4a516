// Per-layer random-sign Hadamard rotations (backend/cpu/hadamard.h, quant/hadamard.h) against
// references written here in float64: the fast transform against the explicit Sylvester matrix
// product (awkward row counts, B 32/64/128), a rotated packed layer against its stored integers
// and scales decoded here and applied to R^T x built from the explicit R, the quantizer's error
// of a rotated unit against tr(E H E^T) / tr(W H W^T) in the original space, the loader's
// refusals, and on a GPU the rotation kernel and the rotated layer against the same references.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/hadamard.h"
#include "backend/cpu/qlinear_ref.h"
#include "backend_test_util.h"
#include "core/error.h"
#include "core/half.h"
#include "model_test_util.h"
#include "quant/hadamard.h"
#include "quant/measure.h"
#include "quant/unit_quant.h"
#ifdef GYRE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/hadamard_device.h"
#endif

namespace gyre {
namespace {

// The explicit R = diag(s) * blockdiag(H_B) [cols x cols] in float64, H_B[i][j] =
// (-1)^popcount(i & j) / sqrt(B).
std::vector<double> explicit_r(const HadamardRotation& r, int cols) {
  std::vector<double> m(static_cast<size_t>(cols) * cols, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(r.block));
  for (int i = 0; i < cols; ++i)
    for (int j = 0; j < cols; ++j) {
      if (i / r.block != j / r.block) continue;
      const int a = i % r.block, b = j % r.block;
      const double h = (std::popcount(static_cast<unsigned>(a & b)) % 2 ? -scale : scale);
      m[static_cast<size_t>(i) * cols + j] = r.signs[i] * h;
    }
  return m;
}

// y = R^T x for each row x of xs [rows, cols], in float64.
std::vector<double> rt_times(const std::vector<double>& r, const std::vector<float>& xs, int rows,
                             int cols) {
  std::vector<double> y(static_cast<size_t>(rows) * cols, 0.0);
  for (int t = 0; t < rows; ++t)
    for (int i = 0; i < cols; ++i) {
      double acc = 0;
      for (int j = 0; j < cols; ++j)
        acc += r[static_cast<size_t>(j) * cols + i] * xs[static_cast<size_t>(t) * cols + j];
      y[static_cast<size_t>(t) * cols + i] = acc;
    }
  return y;
}

std::vector<float> normal(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

HadamardRotation rotation(int cols, int block, uint64_t seed) {
  return {hadamard_random_signs(cols, seed), block};
}

TEST(Hadamard, RotationMatchesTheExplicitMatrixAndInverts) {
  for (int block : {32, 64, 128}) {
    const int cols = 3 * 128, rows = 5;  // several blocks, an awkward row count
    const HadamardRotation r = rotation(cols, block, 11 + block);
    hadamard_validate(r, cols, "test");
    const std::vector<double> rm = explicit_r(r, cols);
    const std::vector<float> x = normal(static_cast<size_t>(rows) * cols, 3);
    std::vector<float> y = x;
    hadamard_rotate_rows(y.data(), rows, cols, r);
    const std::vector<double> want = rt_times(rm, x, rows, cols);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], want[i], 1e-5) << block;
    // Row form: w R, which equals R^T applied to w as a column (R^T's rows are R's columns).
    std::vector<float> w = x;
    hadamard_rotate_rows(w.data(), rows, cols, r);
    for (int t = 0; t < rows; ++t)
      for (int j = 0; j < cols; ++j) {
        double acc = 0;
        for (int i = 0; i < cols; ++i)
          acc += x[static_cast<size_t>(t) * cols + i] * rm[static_cast<size_t>(i) * cols + j];
        ASSERT_NEAR(w[static_cast<size_t>(t) * cols + j], acc, 1e-5);
      }
    hadamard_unrotate_rows(y.data(), rows, cols, r);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], x[i], 1e-5);
  }
  int plus = 0;
  for (int8_t s : hadamard_random_signs(4096, 5)) plus += s == 1;
  EXPECT_NEAR(plus, 2048, 200);  // random signs, not a constant
  EXPECT_EQ(hadamard_block_for(4096), 128);
  EXPECT_EQ(hadamard_block_for(96), 32);
  EXPECT_EQ(hadamard_block_for(172), 0);
}

TEST(Hadamard, ValidationRefusesBadRotations) {
  auto fails = [](const HadamardRotation& r, int64_t cols) {
    try {
      hadamard_validate(r, cols, "layer x");
    } catch (const Error& e) {
      return std::string(e.what()).find('\n') == std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(fails(rotation(96, 48, 1), 96));  // not a power of two
  EXPECT_TRUE(fails(rotation(96, 64, 1), 96));  // does not divide
  EXPECT_TRUE(fails(rotation(64, 32, 1), 96));  // wrong length
  HadamardRotation bad = rotation(64, 32, 1);
  bad.signs[7] = 0;
  EXPECT_TRUE(fails(bad, 64));
}

// The rotated layer: packed (W R)_q, R^T x applied by the CPU backend's folded floats; the oracle
// decodes the stored integers and scales here and multiplies in float64.
struct RotatedLayer {
  int rows = 48, cols = 256;
  HadamardRotation r;
  QWeightHost w;
  std::vector<double> rm;
  RotatedLayer(int bits, int group, int block) {
    r = rotation(cols, block, 77);
    std::vector<float> wr = normal(static_cast<size_t>(rows) * cols, 9, 0.05f);
    hadamard_rotate_rows(wr.data(), rows, cols, r);  // W R
    w = qweight_pack_from_f32(wr.data(), rows, cols, bits, group, false);
    w.had = r;
    rm = explicit_r(r, cols);
  }
  // y [n, rows] = (W R)_q (R^T x) in float64 from the stored integers and scales.
  std::vector<double> reference(const std::vector<float>& x, int n) const {
    const std::vector<double> xr = rt_times(rm, x, n, cols);
    const int offset = 1 << (w.desc.bits - 1);
    std::vector<double> y(static_cast<size_t>(n) * rows, 0.0);
    for (int o = 0; o < rows; ++o)
      for (int c = 0; c < cols; ++c) {
        const double v =
            static_cast<double>(w.scale(o, c / w.desc.group_size)) * (w.q(o, c) - offset);
        for (int t = 0; t < n; ++t)
          y[static_cast<size_t>(t) * rows + o] += v * xr[static_cast<size_t>(t) * cols + c];
      }
    return y;
  }
};

void check_layer(Backend& b, int bits, double tol) {
  for (int block : {32, 64, 128}) {
    const RotatedLayer l(bits, 64, block);
    const Tensor wt = b.upload_weight(qweight_view("model.layers.0.mlp.down_proj.weight", l.w));
    for (int n : {1, 5, 40}) {
      std::mt19937 rng(n);
      const std::vector<float> x = btest::random_f16(static_cast<size_t>(n) * l.cols, rng);
      const btest::Act xa = btest::upload(b, x, n, l.cols);
      Tensor y = b.alloc(n, l.rows);
      b.matmul(y, xa.t, wt, nullptr);
      EXPECT_LT(btest::max_rel_error(btest::host(b, y), l.reference(x, n)), tol)
          << b.name() << " bits " << bits << " block " << block << " n " << n;
    }
  }
}

TEST(Hadamard, RotatedLayerOnCpuMatchesFloat64) {
  auto b = make_cpu_backend(2);
  check_layer(*b, 4, 1e-5);
  check_layer(*b, 3, 1e-5);
}

TEST(HadamardCuda, RotatedLayerOnCudaMatchesFloat64) {
  auto b = mtest::cuda_backend_or_null();
  if (!b) GTEST_SKIP() << "no GPU";
  check_layer(*b, 4, 3e-3);  // FP16 activations and outputs
  check_layer(*b, 3, 3e-3);
  check_layer(*b, 8, 3e-3);
}

#ifdef GYRE_HAVE_CUDA
TEST(HadamardCuda, KernelMatchesTheExplicitMatrix) {
  auto b = mtest::cuda_backend_or_null();
  if (!b) GTEST_SKIP() << "no GPU";
  for (int block : {32, 64, 128, 1024}) {
    const int cols = block == 1024 ? 2048 : 384, n = 7;
    const HadamardRotation r = rotation(cols, block, block);
    std::mt19937 rng(block);
    const std::vector<float> x = btest::random_f16(static_cast<size_t>(n) * cols, rng);
    std::vector<uint16_t> xh(x.size()), yh(x.size());
    for (size_t i = 0; i < x.size(); ++i) xh[i] = f32_to_f16(x[i]);
    void *dx = nullptr, *dy = nullptr, *ds = nullptr;
    ASSERT_EQ(cudaMalloc(&dx, xh.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dy, xh.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&ds, r.signs.size()), cudaSuccess);
    cudaMemcpy(dx, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(ds, r.signs.data(), r.signs.size(), cudaMemcpyHostToDevice);
    cuda::hadamard_rotate(static_cast<half*>(dy), static_cast<const half*>(dx),
                          static_cast<const int8_t*>(ds), n, cols, block, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaMemcpy(yh.data(), dy, yh.size() * 2, cudaMemcpyDeviceToHost);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(ds);
    const std::vector<double> want = rt_times(explicit_r(r, cols), x, n, cols);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(f16_to_f32(yh[i]), want[i], 2e-3 * std::max(1.0, std::fabs(want[i])))
          << "block " << block << " at " << i;
  }
}
#endif

// A rotated unit's relative error, as the quantizer reports it, equals the error of its effective
// weight in the original space under the original Hessian (both in float64 here).
TEST(Hadamard, RotatedUnitErrorIsTheOriginalSpaceError) {
  const int n = 128, rows = 32, tokens = 300;
  std::vector<float> x = normal(static_cast<size_t>(tokens) * n, 4);
  for (int t = 0; t < tokens; ++t) x[static_cast<size_t>(t) * n + 5] *= 20.0f;  // an outlier column
  const std::vector<float> w = normal(static_cast<size_t>(rows) * n, 6, 0.1f);
  quant::QuantContext ctx;
  ctx.hadamard = true;
  ctx.threads = 2;
  quant::UnitQuantizer uq(ctx);
  uq.set_input(x, tokens, "model.layers.0.self_attn.q_proj");
  double err = 0;
  const quant::QuantizedWeight q = uq.quantize(w, QuantSetting{3, 32, true}, &err);
  ASSERT_TRUE(q.had.active());
  EXPECT_EQ(q.had, quant::unit_rotation("model.layers.0.self_attn.q_proj", n));
  double num = 0, den = 0;
  for (int t = 0; t < tokens; ++t)
    for (int o = 0; o < rows; ++o) {
      double e = 0, y = 0;
      for (int c = 0; c < n; ++c) {
        const double xv = x[static_cast<size_t>(t) * n + c];
        e += (w[static_cast<size_t>(o) * n + c] - q.dequant[static_cast<size_t>(o) * n + c]) * xv;
        y += w[static_cast<size_t>(o) * n + c] * xv;
      }
      num += e * e;
      den += y * y;
    }
  EXPECT_NEAR(err, num / den, 1e-4 * num / den + 1e-9);
  // dequant is the packed values unrotated: the loader's floats of this layer.
  std::vector<float> back = q.dequant;
  hadamard_rotate_rows(back.data(), rows, n, q.had);
  for (int o = 0; o < rows; ++o)
    for (int c = 0; c < n; ++c) {
      const int g = c / 32;
      const double v = f16_to_f32(q.scales[static_cast<size_t>(o) * (n / 32) + g]) *
                       (q.q[static_cast<size_t>(o) * n + c] - 4);
      ASSERT_NEAR(back[static_cast<size_t>(o) * n + c], v, 1e-5);
    }
}

}  // namespace
}  // namespace gyre
