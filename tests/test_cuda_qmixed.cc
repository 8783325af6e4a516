// Mixed-width weights (backend/cpu/qmixed.h) on the CUDA backend against the CPU backend, the
// reference (itself checked against float64 decodings of the file in test_quant_mix.cc): a mixed
// layer's matmul at every path (the parts' direct kernels at n <= 8, the batch kernels, the
// dequantized GEMM beyond 128 rows), the fused Q|K|V split and gate/up SwiGLU of mixed parts,
// and a forced-mix conversion of stories260K end to end. Skipped when no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/qmixed.h"
#ifdef GYRE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/qlinear.h"
#endif
#include "engine/transformer.h"
#include "model/loader.h"
#include "model_test_util.h"
#include "quant/convert.h"
#include "quant_file_test_util.h"

namespace gyre {
namespace {

// A mixed weight of random values: groups `hi_groups` at hi_bits, the rest at lo_bits.
QMixedHost random_mixed(int rows, int cols, int group, int lo_bits, int hi_bits, bool asym,
                        const std::vector<int>& hi_groups, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  QMixedHost m;
  m.rows = rows;
  m.cols = cols;
  std::vector<bool> is_hi(static_cast<size_t>(cols / group), false);
  for (int g : hi_groups) is_hi[g] = true;
  std::vector<int32_t> hi_cols, lo_cols;
  for (int c = 0; c < cols; ++c) (is_hi[c / group] ? hi_cols : lo_cols).push_back(c);
  auto part = [&](int bits, std::vector<int32_t> idx) {
    std::vector<float> w(static_cast<size_t>(rows) * idx.size());
    for (float& x : w) x = nd(rng);
    const int n = static_cast<int>(idx.size());
    return QMixedPart{qweight_pack_from_f32(w.data(), rows, n, bits, group, asym), std::move(idx)};
  };
  m.parts.push_back(part(hi_bits, hi_cols));
  m.parts.push_back(part(lo_bits, lo_cols));
  qmixed_validate(m);
  return m;
}

// The two-part kernel's launches so far and the most rows it takes (0 without CUDA, where these
// tests skip).
uint64_t qlinear_pair_launches_or_zero() {
#ifdef GYRE_HAVE_CUDA
  return qlinear_detail::qlinear_pair_launches();
#else
  return 0;
#endif
}
int pair_max_rows() {
#ifdef GYRE_HAVE_CUDA
  return kQlinearPairMaxRows;
#else
  return 0;
#endif
}

// x [n, cols] on a backend: the rows of an F32 table gathered by embed().
Tensor input_on(Backend& b, const std::vector<float>& x, int n, int cols) {
  TensorView v;
  v.name = "x_rows";
  v.dtype = DType::F32;
  v.shape = {n, cols};
  v.data = x.data();
  v.nbytes = x.size() * 4;
  const Tensor table = b.upload_weight(v);
  Tensor t = b.alloc(n, cols);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ids[i] = i;
  b.embed(t, table, ids.data(), n);
  return t;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(got[i] - want[i])));
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(want[i])));
  }
  EXPECT_GT(max_abs, 0.0) << what;
  EXPECT_LE(max_diff, 1e-2 * max_abs + 1e-3) << what << ": max |cpu - cuda| " << max_diff;
}

TEST(QMixedCuda, MatmulSplitAndSwigluMatchTheCpuBackend) {
  auto gpu = mtest::cuda_backend_or_null();
  if (!gpu) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  auto cpu = make_cpu_backend(2);
  struct Case {
    int lo, hi, group;
    bool asym;
  };
  const int cols = 512, rows = 96;
  for (const Case c : {Case{3, 4, 128, false}, Case{2, 3, 64, true}, Case{4, 5, 32, false},
                       Case{5, 6, 128, false}, Case{4, 8, 64, true}}) {
    SCOPED_TRACE(std::to_string(c.lo) + "/" + std::to_string(c.hi) + " g" +
                 std::to_string(c.group));
    const std::vector<int> hi_groups = {0, cols / c.group - 1};
    const QMixedHost w = random_mixed(rows, cols, c.group, c.lo, c.hi, c.asym, hi_groups, 1);
    const QMixedHost w2 = random_mixed(rows, cols, c.group, c.lo, c.hi, c.asym, hi_groups, 2);
    const TensorView v = qmixed_view("model.layers.0.self_attn.q_proj.weight", w);
    const TensorView v2 = qmixed_view("model.layers.0.self_attn.k_proj.weight", w2);
    for (int n : {1, 2, 3, 5, 8, 40, 200}) {  // 1, 2: the two-part kernel where it runs
      SCOPED_TRACE(n);
      std::mt19937 rng(n);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> x(static_cast<size_t>(n) * cols);
      for (float& e : x) e = nd(rng);
      std::vector<float> outs[2][3];
      Backend* backends[2] = {cpu.get(), gpu.get()};
      const uint64_t pairs = qlinear_pair_launches_or_zero();
      for (int bi = 0; bi < 2; ++bi) {
        Backend& b = *backends[bi];
        const Tensor xt = input_on(b, x, n, cols);
        Tensor y = b.alloc(n, rows), y2 = b.alloc(n, rows), s = b.alloc(n, rows);
        b.matmul(y, xt, b.upload_weight(v), nullptr);
        const Tensor qk = b.upload_fused({v, v2}, FusedKind::Concat);
        b.matmul_split({&y2, &s}, xt, qk, nullptr);
        outs[bi][0].resize(static_cast<size_t>(n) * rows);
        b.to_host(y, outs[bi][0].data());
        outs[bi][1].resize(outs[bi][0].size());
        b.to_host(s, outs[bi][1].data());  // the second part's rows: w2 x
        const Tensor gu = b.upload_fused({v, v2}, FusedKind::GateUp);
        Tensor act = b.alloc(n, rows);
        b.matmul_swiglu(act, xt, gu);
        outs[bi][2].resize(outs[bi][0].size());
        b.to_host(act, outs[bi][2].data());
      }
      expect_close(outs[1][0], outs[0][0], "matmul");
      expect_close(outs[1][1], outs[0][1], "matmul_split");
      expect_close(outs[1][2], outs[0][2], "matmul_swiglu");
      // Adjacent widths in groups of 64+ at up to 2 rows: the two-part kernel, once per op.
      const bool pair = c.hi - c.lo == 1 && c.group >= 64 && n <= pair_max_rows();
      EXPECT_EQ(qlinear_pair_launches_or_zero(), pairs + (pair ? 3 : 0));
    }
  }
}

// A weight of several parts as EXL2 layers load (model/exl2.h): widths of their own group sizes
// over shuffled input columns, the last part padded (its padding columns hold random weights
// here, which must not count), matmul and matmul_add against the CPU backend at every path.
// order_seed (not 0): the column order's own seed, so that weights of other values can share one
// layout.
QMixedHost random_parts(int rows, int cols, const std::vector<std::array<int, 3>>& specs,
                        uint32_t seed, uint32_t order_seed = 0, bool asym = false) {
  std::mt19937 rng(seed), order_rng(order_seed);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<int32_t> order(static_cast<size_t>(cols));
  for (int c = 0; c < cols; ++c) order[c] = c;
  std::shuffle(order.begin(), order.end(), order_seed != 0 ? order_rng : rng);
  QMixedHost m;
  m.rows = rows;
  m.cols = cols;
  size_t next = 0;
  for (const auto& [bits, group, real] : specs) {  // real columns, padded to whole groups
    std::vector<int32_t> idx(order.begin() + next, order.begin() + next + real);
    next += real;
    idx.resize((idx.size() + group - 1) / group * group, -1);
    const int n = static_cast<int>(idx.size());
    std::vector<float> w(static_cast<size_t>(rows) * n);
    for (float& x : w) x = nd(rng);
    m.parts.push_back({qweight_pack_from_f32(w.data(), rows, n, bits, group, asym), idx});
  }
  qmixed_validate(m);
  return m;
}

TEST(QMixedCuda, PartsOfSeveralWidthsWithPaddingMatchTheCpuBackend) {
  auto gpu = mtest::cuda_backend_or_null();
  if (!gpu) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  auto cpu = make_cpu_backend(2);
  const int rows = 160, cols = 1056;
  // ExLlamaV2-like: 8 bits g32, 4 bits g128, 3 bits g128 with a short last group; then one
  // padded width alone (a single-width layer whose last group is short).
  const std::vector<std::vector<std::array<int, 3>>> layouts = {
      {{8, 32, 64}, {4, 128, 256}, {3, 128, 736}},
      {{6, 32, 96}, {5, 64, 128}, {4, 128, 384}, {2, 64, 448}},
      {{4, 128, 1056}}};
  for (size_t li = 0; li < layouts.size(); ++li) {
    SCOPED_TRACE(li);
    const QMixedHost w = random_parts(rows, cols, layouts[li], 7 + static_cast<uint32_t>(li));
    const TensorView v = qmixed_view("model.layers.0.mlp.down_proj.weight", w);
    for (int n : {1, 3, 8, 40, 200}) {
      SCOPED_TRACE(n);
      std::mt19937 rng(n);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> x(static_cast<size_t>(n) * cols), r(static_cast<size_t>(n) * rows);
      for (float& e : x) e = nd(rng);
      for (float& e : r) e = nd(rng);
      std::vector<float> norm(static_cast<size_t>(cols));
      for (float& e : norm) e = 0.5f + 0.1f * nd(rng);
      std::vector<float> outs[2][5];
      Backend* backends[2] = {cpu.get(), gpu.get()};
      for (int bi = 0; bi < 2; ++bi) {
        Backend& b = *backends[bi];
        const Tensor xt = input_on(b, x, n, cols), nt = input_on(b, norm, 1, cols);
        Tensor res = input_on(b, r, n, rows);
        Tensor y = b.alloc(n, rows), s = b.alloc(n, rows), y2 = b.alloc(n, rows),
               act = b.alloc(n, rows), xs = b.alloc(n, cols);
        const Tensor wt = b.upload_weight(v);
        b.matmul(y, xt, wt, nullptr);
        b.matmul_add(res, xt, wt, s);
        // The norm folded into the gather (CUDA) against rmsnorm then the product (CPU).
        const TensorView v2 = qmixed_view("model.layers.0.self_attn.k_proj.weight", w);
        b.norm_matmul_split({&y2, &s}, {xt, nt, 1e-5f, xs},
                            b.upload_fused({v, v2}, FusedKind::Concat), nullptr);
        b.norm_matmul_swiglu(act, {xt, nt, 1e-5f, xs}, b.upload_fused({v, v2}, FusedKind::GateUp));
        const Tensor* got[5] = {&y, &res, &y2, &s, &act};
        for (int k = 0; k < 5; ++k) {
          outs[bi][k].resize(static_cast<size_t>(n) * rows);
          b.to_host(*got[k], outs[bi][k].data());
        }
      }
      const char* what[5] = {"matmul", "matmul_add", "norm_matmul_split (first)",
                             "norm_matmul_split (second)", "norm_matmul_swiglu"};
      for (int k = 0; k < 5; ++k) expect_close(outs[1][k], outs[0][k], what[k]);
    }
  }
}

#ifdef GYRE_HAVE_CUDA
// Fused weights whose parts are mixed weights of different layouts (EXL2 layers load so:
// cuda_fused_parts.cc) at one row: one gather fills every group's decode row, normalised when the
// norm is folded in, and the groups' parts read their slices, every kernel after the first staging
// and computing before it waits on the one before (QlinearFusion::x_ready). q|k|v (k and v share
// a layout: one group of two outputs) and gate|up, with and without the norm, against the CPU.
TEST(QMixedCuda, FusedGroupsOfMixedWeightsShareOneGather) {
  auto gpu = mtest::cuda_backend_or_null();
  if (!gpu) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  auto cpu = make_cpu_backend(2);
  const int cols = 1056, q_rows = 160, kv_rows = 96;
  const std::vector<std::array<int, 3>> kv_spec = {{5, 64, 128}, {4, 128, 928}};
  const QMixedHost wq = random_parts(q_rows, cols, {{8, 32, 64}, {4, 128, 256}, {3, 128, 736}}, 51);
  const QMixedHost wk = random_parts(kv_rows, cols, kv_spec, 52, 50);
  const QMixedHost wv = random_parts(kv_rows, cols, kv_spec, 53, 50);
  const QMixedHost wu = random_parts(q_rows, cols, {{6, 32, 96}, {3, 64, 960}}, 54);
  const QMixedHost wd = random_parts(cols, q_rows, {{4, 128, 120}, {3, 64, 40}}, 56);
  const TensorView vq = qmixed_view("model.layers.0.self_attn.q_proj.weight", wq),
                   vk = qmixed_view("model.layers.0.self_attn.k_proj.weight", wk),
                   vv = qmixed_view("model.layers.0.self_attn.v_proj.weight", wv),
                   vg = qmixed_view("model.layers.0.mlp.gate_proj.weight", wq),
                   vu = qmixed_view("model.layers.0.mlp.up_proj.weight", wu),
                   vd = qmixed_view("model.layers.0.mlp.down_proj.weight", wd);
  std::mt19937 rng(55);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(cols), norm(cols), r(cols);
  for (float& e : x) e = nd(rng);
  for (float& e : norm) e = 0.5f + 0.1f * nd(rng);
  for (float& e : r) e = nd(rng);
  std::vector<float> outs[2][9];
  Backend* backends[2] = {cpu.get(), gpu.get()};
  for (int bi = 0; bi < 2; ++bi) {
    Backend& b = *backends[bi];
    const uint64_t before = bi == 1 ? cuda_parts_row_gathers(b) : 0;
    const Tensor xt = input_on(b, x, 1, cols), nt = input_on(b, norm, 1, cols);
    Tensor xs = b.alloc(1, cols), q = b.alloc(1, q_rows), k = b.alloc(1, kv_rows),
           v = b.alloc(1, kv_rows), q2 = b.alloc(1, q_rows), k2 = b.alloc(1, kv_rows),
           v2 = b.alloc(1, kv_rows), act = b.alloc(1, q_rows), act2 = b.alloc(1, q_rows);
    const Tensor qkv = b.upload_fused({vq, vk, vv}, FusedKind::Concat);
    const Tensor gu = b.upload_fused({vg, vu}, FusedKind::GateUp);
    b.norm_matmul_split({&q, &k, &v}, {xt, nt, 1e-5f, xs}, qkv, nullptr);
    b.matmul_split({&q2, &k2, &v2}, xt, qkv, nullptr);
    b.norm_matmul_swiglu(act, {xt, nt, 1e-5f, xs}, gu);
    b.matmul_swiglu(act2, xt, gu);
    // The product handed to a mixed down_proj in its decode row (the up part's epilogue).
    const uint64_t handed = bi == 1 ? cuda_permuted_handoffs(b) : 0;
    const Tensor down = b.upload_weight(vd);
    Tensor act3 = b.alloc(1, q_rows), res = input_on(b, r, 1, cols), s = b.alloc(1, cols);
    b.norm_matmul_swiglu(act3, {xt, nt, 1e-5f, xs}, gu, &down);
    b.matmul_add(res, act3, down, s);
    if (bi == 1) {
      EXPECT_EQ(cuda_permuted_handoffs(b), handed + 1);
    }
    const Tensor* got[9] = {&q, &k, &v, &q2, &k2, &v2, &act, &act2, &res};
    for (int i = 0; i < 9; ++i) {
      outs[bi][i].resize(static_cast<size_t>(got[i]->cols));
      b.to_host(*got[i], outs[bi][i].data());
    }
    if (bi == 1) {
      EXPECT_EQ(cuda_parts_row_gathers(b), before + 5);
    }
  }
  const char* what[9] = {"q (norm)",      "k (norm)", "v (norm)",           "q", "k", "v",
                         "swiglu (norm)", "swiglu",   "swiglu -> down_proj"};
  for (int i = 0; i < 9; ++i) expect_close(outs[1][i], outs[0][i], what[i]);
}

// A decode step's random inputs, drawn in this order from seed: x [x_cols], the residual and the
// norm weights [dim], and a dense weight [dim, wp_cols] of entries about wp_scale.
struct StepInputs {
  std::vector<float> x, r, norm, wp;
};
StepInputs random_step_inputs(int x_cols, int dim, int wp_cols, float wp_scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  StepInputs in{std::vector<float>(static_cast<size_t>(x_cols)),
                std::vector<float>(static_cast<size_t>(dim)),
                std::vector<float>(static_cast<size_t>(dim)),
                std::vector<float>(static_cast<size_t>(dim) * wp_cols)};
  for (float& e : in.x) e = nd(rng);
  for (float& e : in.r) e = nd(rng);
  for (float& e : in.norm) e = 0.5f + 0.1f * nd(rng);
  for (float& e : in.wp) e = wp_scale * nd(rng);
  return in;
}

// The decode row handed over: the residual's producer (Backend::matmul_add's `next`), a mixed
// weight or a packed one, also writes the new sum into the mixed reader's row, and the reader's
// parts stage their slices of it with the norm over the whole row instead of a gather; the
// gate|up SwiGLU (norm_matmul_swiglu's `reader`) writes its product into a mixed down_proj's row.
// Against the same ops without the hand-overs on the GPU and on the CPU.
TEST(QMixedCuda, ReaderTakesTheDecodeRowItsProducerWrote) {
  auto gpu = mtest::cuda_backend_or_null();
  if (!gpu) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  auto cpu = make_cpu_backend(2);
  const int dim = 1056, att = 512, q_rows = 160;
  // Every part of a width whose stream GEMV stages x (no 8-bit part), so both readers have a
  // row: q|k of four widths, gate|up of one padded 4-bit part.
  const QMixedHost wq =
      random_parts(q_rows, dim, {{6, 32, 96}, {5, 64, 128}, {4, 128, 384}, {2, 64, 448}}, 41);
  const QMixedHost wk = random_parts(q_rows, dim, {{4, 128, 1056}}, 42);
  const QMixedHost wo = random_parts(dim, att, {{4, 128, 300}, {3, 64, 212}}, 43);
  // down_proj with an 8-bit part (a row, but not one its parts can normalise): padded widths.
  const QMixedHost wd = random_parts(dim, q_rows, {{8, 32, 40}, {4, 128, 120}}, 45);
  const auto [x, r, norm, wp] = random_step_inputs(att, dim, att, 0.05f, 44);
  const QWeightHost wo_packed = qweight_pack_from_f32(wp.data(), dim, att, 4, 128, false);
  for (const bool packed_producer : {false, true}) {
    SCOPED_TRACE(packed_producer ? "packed producer" : "mixed producer");
    std::vector<float> outs[2][2][3];  // [backend][hand-over][q, k, the residual at the end]
    Backend* backends[2] = {cpu.get(), gpu.get()};
    for (int bi = 0; bi < 2; ++bi) {
      Backend& b = *backends[bi];
      const Tensor qk = b.upload_fused({qmixed_view("model.layers.0.self_attn.q_proj.weight", wq),
                                        qmixed_view("model.layers.0.self_attn.k_proj.weight", wq)},
                                       FusedKind::Concat);
      const Tensor gu = b.upload_fused({qmixed_view("model.layers.0.mlp.gate_proj.weight", wk),
                                        qmixed_view("model.layers.0.mlp.up_proj.weight", wk)},
                                       FusedKind::GateUp);
      const Tensor o =
          packed_producer
              ? b.upload_weight(qweight_view("model.layers.0.self_attn.o_proj.weight", wo_packed))
              : b.upload_weight(qmixed_view("model.layers.0.self_attn.o_proj.weight", wo));
      const Tensor down = b.upload_weight(qmixed_view("model.layers.0.mlp.down_proj.weight", wd));
      const Tensor xt = input_on(b, x, 1, att), nt = input_on(b, norm, 1, dim);
      for (int handed = 0; handed < 2; ++handed) {
        const uint64_t before = bi == 1 ? cuda_permuted_handoffs(b) : 0;
        Tensor res = input_on(b, r, 1, dim), tmp = b.alloc(1, dim), xs = b.alloc(1, dim);
        Tensor q = b.alloc(1, q_rows), k = b.alloc(1, q_rows), act = b.alloc(1, q_rows);
        b.matmul_add(res, xt, o, tmp, handed ? &qk : nullptr);
        b.norm_matmul_split({&q, &k}, {res, nt, 1e-5f, xs}, qk, nullptr);
        b.matmul_add(res, xt, o, tmp, handed ? &gu : nullptr);
        b.norm_matmul_swiglu(act, {res, nt, 1e-5f, xs}, gu, handed ? &down : nullptr);
        b.matmul_add(res, act, down, tmp);
        if (bi == 1) {
          EXPECT_EQ(cuda_permuted_handoffs(b), before + (handed ? 3 : 0));
        }
        const Tensor* got[3] = {&q, &k, &res};
        for (int i = 0; i < 3; ++i) {
          outs[bi][handed][i].resize(static_cast<size_t>(got[i]->cols));
          b.to_host(*got[i], outs[bi][handed][i].data());
        }
      }
    }
    const char* what[3] = {"q", "k", "the residual after down_proj"};
    for (int i = 0; i < 3; ++i) {
      expect_close(outs[1][1][i], outs[0][0][i], what[i]);
      expect_close(outs[1][0][i], outs[0][0][i], what[i]);
    }
  }
}

// Two-width weights read from their decode rows run as one launch of the two-part kernel
// (qlinear_gemv_pair): the Q|K split behind a normalised row, gate|up's SwiGLU into down_proj's
// row and down_proj's accumulate, for each width pair that kernel has, on awkward sizes (rows
// not a multiple of 16, padded parts), at its own plan and at forced warps per tile. The same
// steps with the kernel off (one launch per part) and the CPU backend are the references.
TEST(QMixedCuda, TwoWidthPairsRunInOneLaunchAndMatchTheCpuBackend) {
  auto gpu = mtest::cuda_backend_or_null();
  if (!gpu) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  auto cpu = make_cpu_backend(2);
  const int dim = 1056, hidden = 200;
  struct Pair {
    int hi, lo, group;
    bool asym;
  };
  for (const Pair pr : {Pair{4, 3, 128, false}, Pair{3, 2, 64, false}, Pair{5, 4, 128, false},
                        Pair{6, 5, 64, false}, Pair{4, 3, 64, true}, Pair{3, 2, 128, true}}) {
    SCOPED_TRACE(std::to_string(pr.hi) + "/" + std::to_string(pr.lo) + " g" +
                 std::to_string(pr.group) + (pr.asym ? " asym" : ""));
    const int g = pr.group;
    const QMixedHost wq =
        random_parts(hidden, dim, {{pr.hi, g, 300}, {pr.lo, g, dim - 300}}, 51, 0, pr.asym);
    const QMixedHost wg =
        random_parts(hidden, dim, {{pr.hi, g, 2 * g}, {pr.lo, g, dim - 2 * g}}, 52, 0, pr.asym);
    const QMixedHost wd =
        random_parts(dim, hidden, {{pr.hi, g, g}, {pr.lo, g, hidden - g}}, 53, 0, pr.asym);
    const auto [x, r, norm, wp] = random_step_inputs(dim, dim, dim, 0.03f, 54);
    const QWeightHost wo = qweight_pack_from_f32(wp.data(), dim, dim, 4, 32, false);
    // [cpu, one launch per part, the pair kernel as planned, at 3 and 16 warps per tile (runs
    // that cross from one part into the other)][q, residual]
    constexpr int kRuns = 5;
    std::vector<float> outs[kRuns][2];
    for (int run = 0; run < kRuns; ++run) {
      SCOPED_TRACE(run);
      Backend& b = run == 0 ? *cpu : *gpu;
      qlinear_detail::set_mixed_pair(run == 1 ? 0 : 1, run == 3 ? 3 : run == 4 ? 16 : 0);
      const uint64_t before = qlinear_detail::qlinear_pair_launches();
      const Tensor qk = b.upload_fused({qmixed_view("model.layers.0.self_attn.q_proj.weight", wq),
                                        qmixed_view("model.layers.0.self_attn.k_proj.weight", wq)},
                                       FusedKind::Concat);
      const Tensor gu = b.upload_fused({qmixed_view("model.layers.0.mlp.gate_proj.weight", wg),
                                        qmixed_view("model.layers.0.mlp.up_proj.weight", wg)},
                                       FusedKind::GateUp);
      const Tensor o = b.upload_weight(qweight_view("model.layers.0.self_attn.o_proj.weight", wo));
      const Tensor down = b.upload_weight(qmixed_view("model.layers.0.mlp.down_proj.weight", wd));
      const Tensor xt = input_on(b, x, 1, dim), nt = input_on(b, norm, 1, dim);
      Tensor res = input_on(b, r, 1, dim), tmp = b.alloc(1, dim), xs = b.alloc(1, dim);
      Tensor q = b.alloc(1, hidden), k = b.alloc(1, hidden), act = b.alloc(1, hidden);
      b.matmul_add(res, xt, o, tmp, &qk);
      b.norm_matmul_split({&q, &k}, {res, nt, 1e-5f, xs}, qk, nullptr);
      b.matmul_add(res, xt, o, tmp, &gu);
      b.norm_matmul_swiglu(act, {res, nt, 1e-5f, xs}, gu, &down);  // into down_proj's row
      b.matmul_add(res, act, down, tmp);
      if (run > 0) {
        EXPECT_EQ(qlinear_detail::qlinear_pair_launches(), before + (run == 1 ? 0 : 3));
      }
      outs[run][0].resize(hidden);
      b.to_host(q, outs[run][0].data());
      outs[run][1].resize(dim);
      b.to_host(res, outs[run][1].data());
    }
    qlinear_detail::set_mixed_pair(-1);
    for (int run = 1; run < kRuns; ++run) {
      expect_close(outs[run][0], outs[0][0], "q");
      expect_close(outs[run][1], outs[0][1], "the residual after down_proj");
    }
  }
}
#endif

// The 3-bit GPTQ tiny Llama (tests/data/gptq/llama3: act-order, asymmetric) runs on the narrow
// kernels with a permutation; the CPU backend (checked against its float twin in test_gptq.cc)
// is the reference.
TEST(QMixedCuda, Gptq3BitTinyLlamaMatchesTheCpuBackend) {
  auto gpu = mtest::cuda_backend_or_null();
  if (!gpu) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  const auto m = load_model(std::string(GYRE_SOURCE_DIR) + "/tests/data/gptq/llama3");
  auto cpu = make_cpu_backend(2);
  Transformer a(m->config, m->weights, *cpu, 64);
  Transformer b(m->config, m->weights, *gpu, 64);
  const mtest::LogitsDiff d = mtest::compare_prompt_logits(a, b, m->config.vocab_size);
  expect_close(d.test, d.ref, "logits");
}

TEST(QMixedCuda, ForcedMixStoriesMatchesTheCpuBackend) {
  auto gpu = mtest::cuda_backend_or_null();
  if (!gpu) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  quant::ConvertOptions o = qfile::stories_convert_options("gyre_qmixed_cuda");
  o.uniform = "3:32:asym:4x4";
  quant::convert_model(o);
  const std::string out = o.out;
  const auto m = load_model(out);
  auto cpu = make_cpu_backend(2);
  Transformer a(m->config, m->weights, *cpu, 64);
  Transformer b(m->config, m->weights, *gpu, 64);
  const mtest::LogitsDiff d = mtest::compare_prompt_logits(a, b, m->config.vocab_size);
  expect_close(d.test, d.ref, "logits");
  // Decode: one token at a time (the direct GEMV path of both parts).
  const auto& tokens = mtest::kProbeTokens;
  const int n = static_cast<int>(tokens.size()), vocab = m->config.vocab_size;
  Transformer c(m->config, m->weights, *gpu, 64);
  std::vector<float> step(static_cast<size_t>(vocab));
#ifdef GYRE_HAVE_CUDA
  const uint64_t before = cuda_permuted_handoffs(*gpu);
#endif
  for (int t = 0; t < n; ++t) c.forward(&tokens[t], 1, t, step.data(), false);
#ifdef GYRE_HAVE_CUDA
  // Decode steps hand mixed readers their rows (residual, attention output, SwiGLU product).
  EXPECT_GT(cuda_permuted_handoffs(*gpu), before);
#endif
  expect_close(step, std::vector<float>(d.ref.end() - vocab, d.ref.end()), "decoded last logits");
}

}  // namespace
}  // namespace gyre
