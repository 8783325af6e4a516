// Act-order (GPTQ desc_act) weights through the CUDA backend, as Gyre's converter and GPTQ
// checkpoints make them: every path of a matmul (the decode GEMV, with and without the fused
// RMSNorm, the serving-batch kernel, and prefill's dequantization + cuBLAS with the input gathered
// into the weight's stored column order) against the float64 reference of the host dequantizer,
// at 4 bits and at the narrow widths. Skipped without a GPU.
#include <gtest/gtest.h>

#ifdef GYRE_HAVE_CUDA
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/qlinear_ref.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/qlinear.h"
#include "backend_test_util.h"
#include "core/half.h"
#include "qlinear_test_util.h"

namespace gyre {
namespace {

using namespace qtest;

QWeightHost act_order_weight(int rows, int cols, int bits, int group, bool asym, uint32_t seed) {
  return make_weight({"act-order", group, asym, true, DType::F32}, rows, cols, seed, bits);
}

// n = 1, 2: the decode GEMV; 5, 17, 70: GEMV passes or the serving-batch kernel; 200 (beyond
// kQlinearBatchMaxRows): dequantization in the stored order, the gathered input and cuBLAS.
TEST(CudaActOrder, BackendMatmulMatchesFloat64) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  struct Case {
    int bits, group;
    bool asym;
  };
  const int rows = 272, cols = 512;
  auto b = make_cuda_backend(0, BackendOptions{});
  uint32_t seed = 7;
  for (const Case c : {Case{4, 128, false}, Case{4, 32, true}, Case{6, 64, false},
                       Case{3, 128, false}, Case{8, 128, false}}) {
    const QWeightHost w = act_order_weight(rows, cols, c.bits, c.group, c.asym, seed++);
    const Tensor wt = b->upload_weight(qweight_view("model.layers.0.mlp.down_proj.weight", w));
    for (const int n : {1, 2, 5, 17, 70, 200}) {
      SCOPED_TRACE(std::to_string(c.bits) + "-bit g" + std::to_string(c.group) +
                   (c.asym ? " asym" : "") + " n " + std::to_string(n));
      std::mt19937 rng(seed + n);
      const std::vector<float> x = btest::random_f16(size_t(n) * cols, rng);
      std::vector<uint16_t> xh(x.size());
      for (size_t i = 0; i < x.size(); ++i) xh[i] = f32_to_f16(x[i]);
      const Reference ref = reference(w, xh, nullptr, n);  // dequantize_row undoes the order
      const btest::Act xa = btest::upload(*b, x, n, cols);
      Tensor y = b->alloc(n, rows);
      b->matmul(y, xa.t, wt, nullptr);
      expect_backend_close(btest::host(*b, y), ref);
    }
  }
}

// The decode fusions on act-order weights: the norm folded into the GEMV's gathered staging (its
// weights gathered with x) against rmsnorm + matmul, and the fused q|k|v split at prefill sizes.
TEST(CudaActOrder, FusedNormAndSplitMatchSeparateOps) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int cols = 512, q_rows = 256, kv_rows = 64;
  auto b = make_cuda_backend(0, BackendOptions{});
  for (const int bits : {4, 5}) {
    // One permutation for the three parts, as GPTQ gives layers that share their input.
    QWeightHost wq = act_order_weight(q_rows, cols, bits, 128, false, 40 + bits);
    QWeightHost wk = act_order_weight(kv_rows, cols, bits, 128, false, 50 + bits);
    QWeightHost wv = act_order_weight(kv_rows, cols, bits, 128, false, 60 + bits);
    wk.perm = wq.perm;
    wv.perm = wq.perm;
    const Tensor w = b->upload_fused({qweight_view("model.layers.0.self_attn.q_proj.weight", wq),
                                      qweight_view("model.layers.0.self_attn.k_proj.weight", wk),
                                      qweight_view("model.layers.0.self_attn.v_proj.weight", wv)},
                                     FusedKind::Concat);
    const Tensor wq_t =
        b->upload_weight(qweight_view("model.layers.0.self_attn.q_proj.weight", wq));
    std::mt19937 rng(bits);
    const std::vector<float> nw = btest::random_f16(cols, rng, 1.5f);
    const btest::Act norm = btest::upload(*b, nw, 1, cols);
    for (const int n : {1, 2, 200}) {
      SCOPED_TRACE(std::to_string(bits) + "-bit n " + std::to_string(n));
      const std::vector<float> x = btest::random_f16(size_t(n) * cols, rng);
      const btest::Act xa = btest::upload(*b, x, n, cols);
      Tensor q = b->alloc(n, q_rows), k = b->alloc(n, kv_rows), v = b->alloc(n, kv_rows);
      Tensor xn = b->alloc(n, cols), rq = b->alloc(n, q_rows);
      EXPECT_EQ(b->fuses_norms(n, w), n <= 2);
      if (b->fuses_norms(n, w)) {
        b->norm_matmul_split({&q, &k, &v}, {xa.t, norm.t, 1e-5f, xn}, w, nullptr);
      } else {
        b->rmsnorm(xn, xa.t, norm.t, 1e-5f);
        b->matmul_split({&q, &k, &v}, xn, w, nullptr);
      }
      b->rmsnorm(xn, xa.t, norm.t, 1e-5f);
      b->matmul(rq, xn, wq_t, nullptr);
      EXPECT_LT(btest::rel_error(btest::host(*b, q), btest::host(*b, rq)), 2e-3);
      std::vector<uint16_t> xnh(size_t(n) * cols);
      const std::vector<float> xnf = btest::host(*b, xn);
      for (size_t i = 0; i < xnh.size(); ++i) xnh[i] = f32_to_f16(xnf[i]);
      expect_backend_close(btest::host(*b, v), reference(wv, xnh, nullptr, n));
    }
  }
}

}  // namespace
}  // namespace gyre

#endif
