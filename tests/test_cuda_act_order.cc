// Act-order (GPTQ desc_act) weights through the CUDA backend, as Gyre's converter and GPTQ
// checkpoints make them: every path of a matmul (the decode GEMV, with and without the fused
// RMSNorm, the serving-batch kernel, and prefill's dequantization + cuBLAS with the input gathered
// into the weight's stored column order) against the float64 reference of the host dequantizer,
// at 4 bits and at the narrow widths; and the residual handed to such a weight in its column
// order by the matmul_add before it, and the attention output handed to an act-order o_proj.
// Skipped without a GPU.
#include <gtest/gtest.h>

#ifdef GYRE_HAVE_CUDA
#include <cmath>
#include <memory>
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

// The residual handed over in the next weight's column order (Backend::matmul_add's `next`): the
// producer's epilogue also writes the sum permuted, and the act-order q|k|v or gate|up GEMV after
// it stages that copy plainly with permuted norm weights. Against the same ops without the
// hand-over (the sum itself must be bit for bit the same) and the float64 reference; a
// different residual of the same shape must not take the copy.
TEST(CudaActOrder, ResidualHandedOverInTheNextWeightsOrder) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int dim = 512, att_cols = 256, q_rows = 256, kv_rows = 64, hidden = 96;
  auto b = make_cuda_backend(0, BackendOptions{});
  for (const int bits : {4, 5, 3}) {
    QWeightHost wo = act_order_weight(dim, att_cols, 4, 128, false, 70 + bits);
    QWeightHost wq = act_order_weight(q_rows, dim, bits, 128, bits == 3, 80 + bits);
    QWeightHost wk = act_order_weight(kv_rows, dim, bits, 128, bits == 3, 90 + bits);
    QWeightHost wv = act_order_weight(kv_rows, dim, bits, 128, bits == 3, 100 + bits);
    QWeightHost wg = act_order_weight(hidden, dim, bits, 64, false, 110 + bits);
    QWeightHost wu = act_order_weight(hidden, dim, bits, 64, false, 120 + bits);
    wk.perm = wv.perm = wq.perm;
    wu.perm = wg.perm;
    const Tensor o = b->upload_weight(qweight_view("model.layers.0.self_attn.o_proj.weight", wo));
    const Tensor qkv = b->upload_fused({qweight_view("model.layers.0.self_attn.q_proj.weight", wq),
                                        qweight_view("model.layers.0.self_attn.k_proj.weight", wk),
                                        qweight_view("model.layers.0.self_attn.v_proj.weight", wv)},
                                       FusedKind::Concat);
    const Tensor gu = b->upload_fused({qweight_view("model.layers.0.mlp.gate_proj.weight", wg),
                                       qweight_view("model.layers.0.mlp.up_proj.weight", wu)},
                                      FusedKind::GateUp);
    std::mt19937 rng(bits);
    const btest::Act norm = btest::upload(*b, btest::random_f16(dim, rng, 1.5f), 1, dim);
    for (const int n : {1, 2}) {
      SCOPED_TRACE(std::to_string(bits) + "-bit n " + std::to_string(n));
      ASSERT_TRUE(b->fuses_norms(n, qkv) && b->fuses_norms(n, gu));
      const std::vector<float> r0 = btest::random_f16(size_t(n) * dim, rng, 2.0f);
      const btest::Act att =
          btest::upload(*b, btest::random_f16(size_t(n) * att_cols, rng), n, att_cols);
      btest::Act handed = btest::upload(*b, r0, n, dim), plain = btest::upload(*b, r0, n, dim),
                 other = btest::upload(*b, r0, n, dim);
      Tensor tmp = b->alloc(n, dim), xn = b->alloc(n, dim);
      auto qkv_out = [&] {
        return std::vector<Tensor>{b->alloc(n, q_rows), b->alloc(n, kv_rows), b->alloc(n, kv_rows)};
      };
      std::vector<Tensor> got = qkv_out(), want = qkv_out(), own = qkv_out();
      const uint64_t before = cuda_permuted_handoffs(*b);
      b->matmul_add(handed.t, att.t, o, tmp, &qkv);
      b->norm_matmul_split({&got[0], &got[1], &got[2]}, {handed.t, norm.t, 1e-5f, xn}, qkv,
                           nullptr);
      EXPECT_EQ(cuda_permuted_handoffs(*b), before + 1);
      b->matmul_add(plain.t, att.t, o, tmp);
      b->norm_matmul_split({&want[0], &want[1], &want[2]}, {plain.t, norm.t, 1e-5f, xn}, qkv,
                           nullptr);
      // The copy was made for `handed`: a residual elsewhere reads itself.
      b->matmul_add(handed.t, att.t, o, tmp, &qkv);
      b->matmul_add(other.t, att.t, o, tmp);
      b->norm_matmul_split({&own[0], &own[1], &own[2]}, {other.t, norm.t, 1e-5f, xn}, qkv, nullptr);
      EXPECT_EQ(cuda_permuted_handoffs(*b), before + 1);
      const std::vector<float> sum = btest::host(*b, plain.t);
      EXPECT_EQ(btest::host(*b, other.t), sum);
      for (int i = 0; i < 3; ++i) {
        EXPECT_LT(
            btest::rel_error(btest::host(*b, got[size_t(i)]), btest::host(*b, want[size_t(i)])),
            1e-3)
            << i;
        EXPECT_LT(
            btest::rel_error(btest::host(*b, own[size_t(i)]), btest::host(*b, want[size_t(i)])),
            1e-6)
            << i;
      }
      b->rmsnorm(xn, plain.t, norm.t, 1e-5f);
      std::vector<uint16_t> xnh(size_t(n) * dim);
      const std::vector<float> xnf = btest::host(*b, xn);
      for (size_t i = 0; i < xnh.size(); ++i) xnh[i] = f32_to_f16(xnf[i]);
      expect_backend_close(btest::host(*b, got[2]), reference(wv, xnh, nullptr, n));

      // gate|up: the same hand-over into the SwiGLU GEMV (the residual now `handed` twice over).
      btest::Act h2 = btest::upload(*b, r0, n, dim), p2 = btest::upload(*b, r0, n, dim);
      Tensor hs = b->alloc(n, hidden), ps = b->alloc(n, hidden);
      b->matmul_add(h2.t, att.t, o, tmp, &gu);
      b->norm_matmul_swiglu(hs, {h2.t, norm.t, 1e-5f, xn}, gu);
      EXPECT_EQ(cuda_permuted_handoffs(*b), before + 2);
      b->matmul_add(p2.t, att.t, o, tmp);
      b->norm_matmul_swiglu(ps, {p2.t, norm.t, 1e-5f, xn}, gu);
      EXPECT_EQ(btest::host(*b, h2.t), sum);
      EXPECT_LT(btest::rel_error(btest::host(*b, hs), btest::host(*b, ps)), 1e-3);
    }
  }
}

// The attention output handed to an act-order o_proj (rope_attention's reader): the decode
// kernel of a single row writes it in o_proj's column order (one block per head group, and split
// shares combined in the kernel, by the online and by the weighted merge), and o_proj's
// matmul_add reads it without the permutation. Against the same steps on a second cache without
// the reader (the same sums: the GEMV sees the same staged values); 2 rows and prefill rows keep
// the natural order.
TEST(CudaActOrder, AttentionOutputHandedToAnActOrderOProj) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int heads = 8, kv_heads = 2, hd = 64, width = heads * hd, dim = 256;
  auto b = make_cuda_backend(0, BackendOptions{});
  const QWeightHost wo = act_order_weight(dim, width, 4, 128, false, 140);
  const Tensor o = b->upload_weight(qweight_view("model.layers.0.self_attn.o_proj.weight", wo));
  std::unique_ptr<KvCache> caches[2] = {b->new_kv_cache(1, kv_heads, hd, 800),
                                        b->new_kv_cache(1, kv_heads, hd, 800)};
  AttentionParams p;
  p.n_heads = heads;
  p.n_kv_heads = kv_heads;
  p.head_dim = hd;
  p.scale = 0.125f;
  RopeTable table;
  table.rot_dim = hd;
  for (int i = 0; i < hd / 2; ++i)
    table.inv_freq.push_back(static_cast<float>(std::pow(10000.0, -2.0 * i / hd)));
  std::mt19937 rng(141);
  int pos = 0;
  for (const int n : {37, 1, 1, 2, 660, 1, 2}) {
    SCOPED_TRACE("rows " + std::to_string(n) + " at " + std::to_string(pos));
    const std::vector<float> qv = btest::random_f16(size_t(n) * width, rng, 2.0f),
                             kv = btest::random_f16(size_t(n) * kv_heads * hd, rng, 2.0f),
                             vv = btest::random_f16(size_t(n) * kv_heads * hd, rng),
                             r0 = btest::random_f16(size_t(n) * dim, rng);
    std::vector<float> sums[2];
    const uint64_t before = cuda_permuted_handoffs(*b);
    for (int which = 0; which < 2; ++which) {
      btest::Act q = btest::upload(*b, qv, n, width), k = btest::upload(*b, kv, n, kv_heads * hd),
                 v = btest::upload(*b, vv, n, kv_heads * hd), res = btest::upload(*b, r0, n, dim);
      Tensor att = b->alloc(n, width), tmp = b->alloc(n, dim);
      b->rope_attention(att, q.t, k.t, v.t, *caches[which], 0, pos, p, table,
                        which == 0 ? &o : nullptr);
      b->matmul_add(res.t, att, o, tmp);
      sums[which] = btest::host(*b, res.t);
    }
    EXPECT_EQ(cuda_permuted_handoffs(*b), before + (n == 1 ? 1 : 0));  // the decode row
    EXPECT_LT(btest::rel_error(sums[0], sums[1]), 1e-6);
    pos += n;
  }
}

}  // namespace
}  // namespace gyre

#endif
