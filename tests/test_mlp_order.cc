// The MLP's hidden units renumbered into an act-order down_proj's column order
// (engine/mlp_order.h, qweight_permute_rows): the rewritten weights compute the same MLP on the
// CPU backend, rows move with their scales, and the cases it must leave alone.
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/qlinear_ref.h"
#include "backend/cpu/qmixed.h"
#include "backend_test_util.h"
#include "core/error.h"
#include "engine/mlp_order.h"

namespace gyre {
namespace {

QWeightHost random_weight(int rows, int cols, int bits, bool asym, bool act_order, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-0.1f, 0.1f);
  std::vector<float> w(size_t(rows) * cols);
  for (float& v : w) v = u(rng);
  std::vector<int32_t> perm(cols);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  return qweight_pack_from_f32(w.data(), rows, cols, bits, 32, asym,
                               act_order ? perm.data() : nullptr);
}

TEST(MlpOrder, PermutedRowsKeepTheirValues) {
  for (const int bits : {4, 3, 8}) {
    const QWeightHost w = random_weight(24, 64, bits, bits == 3, true, 1);
    std::vector<int32_t> order(24);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(2));
    const QWeightHost p = qweight_permute_rows(w, order);
    std::vector<float> a(64), b(64);
    for (int j = 0; j < 24; ++j) {
      qweight_dequantize_row(p, j, a.data());
      qweight_dequantize_row(w, order[size_t(j)], b.data());
      EXPECT_EQ(a, b) << bits << "-bit row " << j;
    }
  }
  const QWeightHost w = random_weight(8, 64, 4, false, false, 3);
  EXPECT_THROW(qweight_permute_rows(w, {0, 1, 2}), Error);
  EXPECT_THROW(qweight_permute_rows(w, {0, 0, 1, 2, 3, 4, 5, 6}), Error);
}

// SwiGLU MLP on the CPU backend: down . (silu(x . gate) * (x . up)).
std::vector<float> mlp(Backend& b, const std::vector<TensorView>& gate_up, const TensorView& down,
                       const btest::Act& x, int n, int hidden, int dim) {
  const Tensor gu = b.upload_fused(gate_up, FusedKind::GateUp);
  const Tensor d = b.upload_weight(down);
  Tensor h = b.alloc(n, hidden), y = b.alloc(n, dim);
  b.matmul_swiglu(h, x.t, gu);
  b.matmul(y, h, d, nullptr);
  return btest::host(b, y);
}

TEST(MlpOrder, RenumberedHiddenUnitsComputeTheSameMlp) {
  const int dim = 64, hidden = 96, n = 3;
  auto cpu = make_cpu_backend(2);
  for (const bool gate_act_order : {false, true}) {
    const QWeightHost gate = random_weight(hidden, dim, 4, false, gate_act_order, 10),
                      up = random_weight(hidden, dim, 4, true, gate_act_order, 11),
                      down = random_weight(dim, hidden, 4, false, true, 12);
    const auto r =
        mlp_in_down_order(qweight_view("g", gate), qweight_view("u", up), qweight_view("d", down));
    ASSERT_TRUE(r.has_value());
    EXPECT_FALSE(r->down.desc.has_perm);
    EXPECT_TRUE(r->down.perm.empty());
    std::mt19937 rng(5);
    const btest::Act x = btest::upload(*cpu, btest::random_f16(size_t(n) * dim, rng), n, dim);
    const std::vector<float> want = mlp(*cpu, {qweight_view("g", gate), qweight_view("u", up)},
                                        qweight_view("d", down), x, n, hidden, dim);
    const std::vector<float> got =
        mlp(*cpu, r->gate_up_views("g", "u"), r->down_view("d"), x, n, hidden, dim);
    EXPECT_LT(btest::rel_error(got, want), 1e-5);
  }
}

TEST(MlpOrder, LeavesOtherWeightsAlone) {
  const QWeightHost gate = random_weight(96, 64, 4, false, false, 20),
                    up = random_weight(96, 64, 4, false, false, 21),
                    plain_down = random_weight(64, 96, 4, false, false, 22);
  EXPECT_FALSE(mlp_in_down_order(qweight_view("g", gate), qweight_view("u", up),
                                 qweight_view("d", plain_down))
                   .has_value());
  QWeightHost identity_down = random_weight(64, 96, 4, false, true, 23);
  std::iota(identity_down.perm.begin(), identity_down.perm.end(), 0);
  EXPECT_FALSE(mlp_in_down_order(qweight_view("g", gate), qweight_view("u", up),
                                 qweight_view("d", identity_down))
                   .has_value());
  const QWeightHost down = random_weight(64, 96, 4, false, true, 24);
  std::vector<float> f(96 * 64, 0.5f);
  TensorView dense;
  dense.name = "g";
  dense.dtype = DType::F32;
  dense.shape = {96, 64};
  dense.data = f.data();
  dense.nbytes = f.size() * sizeof(float);
  EXPECT_FALSE(
      mlp_in_down_order(dense, qweight_view("u", up), qweight_view("d", down)).has_value());
  // A mix of widths (an EXL2 layer of several, Gyre's mixes) as any of the three.
  QMixedHost mixed;
  mixed.rows = 64;
  mixed.cols = 96;
  std::vector<int32_t> cols(96);
  std::iota(cols.begin(), cols.end(), 0);
  mixed.parts.push_back({random_weight(64, 96, 4, false, false, 25), cols});
  qmixed_validate(mixed);
  EXPECT_FALSE(
      mlp_in_down_order(qweight_view("g", gate), qweight_view("u", up), qmixed_view("d", mixed))
          .has_value());
  EXPECT_FALSE(
      mlp_in_down_order(qmixed_view("g", mixed), qweight_view("u", up), qweight_view("d", down))
          .has_value());
}

}  // namespace
}  // namespace gyre
