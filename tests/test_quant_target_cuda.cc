// Target correction's GPU path (GptqDevice::set_target / corrected_target, quant/cuda/
// target_cuda.cu) against the CPU float64 code it replaces, the oracle (target_correction.h):
// the cross-covariance C, lambda and the corrected target W* on awkward sizes (widths 96/160/
// 384, rows not a multiple of anything, fewer tokens than columns, a column that never sees
// input), with and without a Hadamard rotation of the inputs; then the whole UnitQuantizer hook.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <tuple>

#include "backend/backend.h"
#include "core/error.h"
#include "quant/gptq.h"
#include "quant/gptq_device.h"
#include "quant/hadamard.h"
#include "quant/measure.h"
#include "quant/target_correction.h"
#include "quant/unit_quant.h"

namespace gyre::quant {
namespace {

struct Shape {
  int tokens, n, rows;
};

constexpr int kDeadColumn = 3;
const char* const kUnit = "model.layers.0.self_attn.q_proj";

// x_fp: correlated columns of unequal scale, column kDeadColumn always zero. x_q: the same
// tokens after "quantized layers" (a perturbation), the dead column still dead.
void inputs(const Shape& s, std::vector<float>& x_fp, std::vector<float>& x_q) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  x_fp.assign(static_cast<size_t>(s.tokens) * s.n, 0.0f);
  x_q = x_fp;
  for (int t = 0; t < s.tokens; ++t) {
    const float common = nd(rng);
    for (int k = 0; k < s.n; ++k) {
      if (k == kDeadColumn) continue;
      const size_t i = static_cast<size_t>(t) * s.n + k;
      x_fp[i] = 0.6f * common + nd(rng) * static_cast<float>(1 + k % 5);
      x_q[i] = x_fp[i] * 0.97f + 0.1f * nd(rng);
    }
  }
}

std::vector<float> weights(int rows, int n) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> w(static_cast<size_t>(rows) * n);
  for (float& v : w) v = nd(rng);
  return w;
}

// Both sides round their float64 result to float: equal, or within 1e-9 relative, or the two
// floats next to each other (a float64 value near a rounding boundary).
bool float_close(float gpu, float cpu) {
  const double d = std::fabs(static_cast<double>(gpu) - cpu);
  return d <= 1e-9 * std::fabs(cpu) + 1e-15 || std::nextafter(cpu, gpu) == gpu;
}

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

class QuantTargetCuda : public ::testing::TestWithParam<std::tuple<Shape, bool>> {};

TEST_P(QuantTargetCuda, CrossFactorAndTargetMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const auto [s, rotate] = GetParam();
  std::vector<float> x_fp, x_q;
  inputs(s, x_fp, x_q);
  std::vector<float> w = weights(s.rows, s.n);
  if (rotate) {  // what UnitQuantizer does to a rotated unit's inputs and weights
    const HadamardRotation r = unit_rotation(kUnit, s.n);
    ASSERT_TRUE(r.active());
    hadamard_rotate_rows(x_fp.data(), s.tokens, s.n, r);
    hadamard_rotate_rows(x_q.data(), s.tokens, s.n, r);
    hadamard_rotate_rows(w.data(), s.rows, s.n, r);
  }
  constexpr double kTargetDamp = 0.1;
  auto gpu = make_gptq_device("cuda");
  gpu->set_input(x_q.data(), s.tokens, s.n, 0.01, true, false);
  const double lambda_gpu = gpu->set_target(x_fp.data(), x_q.data(), s.tokens, kTargetDamp);

  const std::vector<double> h = hessian_of(x_q, s.tokens, s.n, 2);
  const std::vector<double> c_cpu = cross_covariance(x_fp, x_q, s.tokens, s.n, 2);
  const DampedFactor f = damped_factor(h, s.n, kTargetDamp);
  EXPECT_NEAR(lambda_gpu, f.lambda, 1e-9 * f.lambda);

  const std::vector<double> c_gpu = gpu->cross_covariance();
  ASSERT_EQ(c_gpu.size(), c_cpu.size());
  for (size_t i = 0; i < c_cpu.size(); ++i)
    ASSERT_NEAR(c_gpu[i], c_cpu[i], 1e-9 * (1.0 + std::fabs(c_cpu[i]))) << i;
  if (!rotate) {  // the dead column's row and column of C are exactly zero on the device too
    for (int k = 0; k < s.n; ++k) {
      EXPECT_EQ(c_gpu[static_cast<size_t>(kDeadColumn) * s.n + k], 0.0);
      EXPECT_EQ(c_gpu[static_cast<size_t>(k) * s.n + kDeadColumn], 0.0);
    }
  }

  const std::vector<float> t_cpu = corrected_target(w, s.n, c_cpu, f, 2);
  const std::vector<float> t_gpu = gpu->corrected_target(w.data(), s.rows);
  ASSERT_EQ(t_gpu.size(), t_cpu.size());
  double moved = 0.0;
  for (size_t i = 0; i < t_cpu.size(); ++i) {
    ASSERT_TRUE(float_close(t_gpu[i], t_cpu[i])) << i << ": " << t_gpu[i] << " vs " << t_cpu[i];
    moved += std::fabs(t_cpu[i] - w[i]);
  }
  EXPECT_GT(moved, 0.0);  // x_q differs from x_fp, so W* is not W

  // A second set_input drops the correction; a new one is computed from scratch.
  gpu->set_input(x_fp.data(), s.tokens, s.n, 0.01, false, false);
  EXPECT_THROW(gpu->corrected_target(w.data(), s.rows), Error);
  gpu->set_target(x_fp.data(), x_fp.data(), s.tokens, kTargetDamp);
  const std::vector<float> same = gpu->corrected_target(w.data(), s.rows);
  // X_q = X_f: W* = W up to rounding (target_correction.h), except in a dead column, where H's
  // zero diagonal counts as 1 but C's stays 0 (on the CPU alike).
  for (size_t i = 0; i < w.size(); ++i) {
    if (!rotate && static_cast<int>(i % s.n) == kDeadColumn) continue;
    ASSERT_NEAR(same[i], w[i], 1e-5 * (1e-3 + std::fabs(w[i]))) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(AwkwardShapes, QuantTargetCuda,
                         ::testing::Combine(::testing::Values(Shape{300, 96, 37},
                                                              Shape{50, 160, 129},
                                                              Shape{200, 384, 37}),
                                            ::testing::Bool()));

// The UnitQuantizer hook: with --target-correction on the GPU path the layer is quantized toward
// the device's W*; the CPU path (W* on the host) is the oracle. GPTQ itself differs by summation
// order, so a rare code rounds the other way; without the correction many codes differ.
TEST(QuantTargetCudaUnit, QuantizesTowardTheDeviceTarget) {
  SKIP_WITHOUT_GPU();
  const Shape s{300, 384, 64};
  std::vector<float> x_fp, x_q;
  inputs(s, x_fp, x_q);
  const std::vector<float> w = weights(s.rows, s.n);
  const QuantSetting st{3, 128, true};
  for (const bool hadamard : {false, true}) {
    QuantContext cpu_ctx;
    cpu_ctx.hadamard = hadamard;
    cpu_ctx.target_correction = true;
    cpu_ctx.threads = 2;
    QuantContext gpu_ctx = cpu_ctx;
    auto gpu = make_gptq_device("cuda");
    gpu_ctx.gpu = gpu.get();
    QuantContext plain_ctx = gpu_ctx;
    plain_ctx.target_correction = false;
    UnitQuantizer on_cpu(cpu_ctx, true), on_gpu(gpu_ctx, true), plain(plain_ctx, true);
    on_cpu.set_input(x_q, s.tokens, kUnit, &x_fp);
    on_gpu.set_input(x_q, s.tokens, kUnit, &x_fp);
    double e_cpu = 0, e_gpu = 0, e_plain = 0;
    const QuantizedWeight q_cpu = on_cpu.quantize(w, st, &e_cpu);
    const QuantizedWeight q_gpu = on_gpu.quantize(w, st, &e_gpu);
    EXPECT_NEAR(e_gpu, e_cpu, 2e-3 * e_cpu) << "hadamard " << hadamard;
    plain.set_input(x_q, s.tokens, kUnit, &x_fp);
    const QuantizedWeight q_plain = plain.quantize(w, st, &e_plain);
    // Stored integers, in the space GPTQ worked in: with a rotation one flipped code would
    // change a whole block of the unrotated dequantized row.
    ASSERT_EQ(q_gpu.q.size(), q_cpu.q.size());
    ASSERT_EQ(q_plain.q.size(), q_cpu.q.size());
    size_t differ = 0, differ_plain = 0;
    for (size_t i = 0; i < q_cpu.q.size(); ++i) {
      differ += q_gpu.q[i] != q_cpu.q[i];
      differ_plain += q_plain.q[i] != q_cpu.q[i];
    }
    EXPECT_LT(differ, q_cpu.q.size() / 100) << "hadamard " << hadamard;
    EXPECT_GT(differ_plain, 4 * differ + 10) << "hadamard " << hadamard;
  }
}

}  // namespace
}  // namespace gyre::quant
