// Fused Q|K|V and gate|up whose parts differ in width or mix (cuda_fused_parts.cc: kept
// quantized as groups, one matmul per group). Oracles: the CUDA backend's own unfused ops on the
// separately uploaded parts (matmul per part, rmsnorm first for the norm-fused variants, then
// silu_mul), and the CPU backend running the same quantized parts (its default fused ops).
// Awkward sizes (rows not multiples of 16, 7 column groups), every matmul path (decode GEMV with
// the folded norm, the dequantized GEMV/GEMM beyond it) and a replayed CUDA graph of the decode
// step. Skipped when no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/qmixed.h"
#include "model_test_util.h"
#ifdef GYRE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace gyre {
namespace {

constexpr int kCols = 448, kGroup = 64, kQ = 96, kKv = 40, kHidden = 200;

std::vector<float> normal(size_t count, float sd, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(count);
  for (float& x : v) x = nd(rng);
  return v;
}

QWeightHost packed(int rows, int bits, bool asym, uint32_t seed) {
  const auto w = normal(static_cast<size_t>(rows) * kCols, 0.05f, seed);
  return qweight_pack_from_f32(w.data(), rows, kCols, bits, kGroup, asym);
}

// Groups `hi_groups` at hi_bits, the others at lo_bits.
QMixedHost mixed(int rows, int lo_bits, int hi_bits, const std::vector<int>& hi_groups,
                 uint32_t seed) {
  QMixedHost m;
  m.rows = rows;
  m.cols = kCols;
  std::vector<int32_t> hi_cols, lo_cols;
  for (int c = 0; c < kCols; ++c) {
    const bool hi = std::find(hi_groups.begin(), hi_groups.end(), c / kGroup) != hi_groups.end();
    (hi ? hi_cols : lo_cols).push_back(c);
  }
  auto part = [&](int bits, std::vector<int32_t> idx, uint32_t s) {
    const auto w = normal(static_cast<size_t>(rows) * idx.size(), 0.05f, s);
    const int n = static_cast<int>(idx.size());
    return QMixedPart{qweight_pack_from_f32(w.data(), rows, n, bits, kGroup, false),
                      std::move(idx)};
  };
  m.parts.push_back(part(hi_bits, hi_cols, seed));
  m.parts.push_back(part(lo_bits, lo_cols, seed + 1));
  qmixed_validate(m);
  return m;
}

// The five projections of one layer as host weights (kept alive here) and their views.
struct Parts {
  std::vector<QWeightHost> packs;
  std::vector<QMixedHost> mixes;
  std::vector<TensorView> qkv, gate_up;
};

// Case 0: q 4-bit, k and v 6-bit (one group k|v), gate 3-bit, up 5-bit asymmetric: every part
// fuses its norm at n <= 2. Case 1: q mixed 3/4, k 5-bit, v mixed 3/4 with other columns, gate
// mixed, up 4-bit: the unfused path (rmsnorm, gathered mixed products).
Parts make_parts(int which) {
  Parts p;
  p.packs.reserve(8);
  p.mixes.reserve(8);
  auto pk = [&](const char* name, int rows, int bits, bool asym, uint32_t seed) {
    p.packs.push_back(packed(rows, bits, asym, seed));
    return qweight_view(name, p.packs.back());
  };
  auto mx = [&](const char* name, int rows, std::vector<int> hi, uint32_t seed) {
    p.mixes.push_back(mixed(rows, 3, 4, hi, seed));
    return qmixed_view(name, p.mixes.back());
  };
  const char *q = "l.q_proj.weight", *k = "l.k_proj.weight", *v = "l.v_proj.weight",
             *g = "l.gate_proj.weight", *u = "l.up_proj.weight";
  if (which == 0) {
    p.qkv = {pk(q, kQ, 4, false, 1), pk(k, kKv, 6, false, 2), pk(v, kKv, 6, false, 3)};
    p.gate_up = {pk(g, kHidden, 3, false, 4), pk(u, kHidden, 5, true, 5)};
  } else {
    p.qkv = {mx(q, kQ, {0, 6}, 6), pk(k, kKv, 5, false, 7), mx(v, kKv, {2}, 8)};
    p.gate_up = {mx(g, kHidden, {1, 3}, 9), pk(u, kHidden, 4, false, 10)};
  }
  return p;
}

// x [n, kCols] on a backend: rows of an F32 table gathered by embed().
Tensor input_on(Backend& b, const std::vector<float>& x, int n) {
  TensorView v;
  v.name = "x_rows";
  v.dtype = DType::F32;
  v.shape = {n, kCols};
  v.data = x.data();
  v.nbytes = x.size() * 4;
  const Tensor table = b.upload_weight(v);
  Tensor t = b.alloc(n, kCols);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = i;
  b.embed(t, table, ids.data(), n);
  return t;
}

std::vector<float> host_of(Backend& b, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.rows * t.cols));
  b.to_host(t, v.data());
  return v;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(got[i] - want[i])));
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(want[i])));
  }
  EXPECT_GT(max_abs, 0.0) << what;
  EXPECT_LE(max_diff, 1e-2 * max_abs + 1e-3) << what << ": max diff " << max_diff;
}

// The fused ops of one layer on backend b (norm folded when `norm`): q, k, v and the SwiGLU.
struct Outputs {
  std::vector<float> q, k, v, act;
};

struct LayerOnBackend {
  Backend& b;
  Tensor x, norm, xn, q, k, v, act, up, wqkv, wgu;
  std::vector<Tensor> parts;  // q, k, v, gate, up uploaded separately
  LayerOnBackend(Backend& be, const Parts& p, const std::vector<float>& xh,
                 const std::vector<float>& norm_h, int n)
      : b(be) {
    x = input_on(b, xh, n);
    TensorView nv;
    nv.name = "l.input_layernorm.weight";
    nv.dtype = DType::F32;
    nv.shape = {kCols};
    nv.data = norm_h.data();
    nv.nbytes = norm_h.size() * 4;
    norm = b.upload_weight(nv);
    xn = b.alloc(n, kCols);
    q = b.alloc(n, kQ);
    k = b.alloc(n, kKv);
    v = b.alloc(n, kKv);
    act = b.alloc(n, kHidden);
    up = b.alloc(n, kHidden);
    wqkv = b.upload_fused(p.qkv, FusedKind::Concat);
    wgu = b.upload_fused(p.gate_up, FusedKind::GateUp);
    for (const TensorView& t : p.qkv) parts.push_back(b.upload_weight(t));
    for (const TensorView& t : p.gate_up) parts.push_back(b.upload_weight(t));
  }
  void fused(bool with_norm) {
    if (with_norm) {
      b.norm_matmul_split({&q, &k, &v}, {x, norm, 1e-5f, xn}, wqkv, nullptr);
      b.norm_matmul_swiglu(act, {x, norm, 1e-5f, xn}, wgu);
    } else {
      b.matmul_split({&q, &k, &v}, x, wqkv, nullptr);
      b.matmul_swiglu(act, x, wgu);
    }
  }
  void unfused(bool with_norm) {
    const Tensor* in = &x;
    if (with_norm) {
      b.rmsnorm(xn, x, norm, 1e-5f);
      in = &xn;
    }
    b.matmul(q, *in, parts[0], nullptr);
    b.matmul(k, *in, parts[1], nullptr);
    b.matmul(v, *in, parts[2], nullptr);
    b.matmul(act, *in, parts[3], nullptr);
    b.matmul(up, *in, parts[4], nullptr);
    b.silu_mul(act, act, up);
  }
  Outputs read() { return {host_of(b, q), host_of(b, k), host_of(b, v), host_of(b, act)}; }
};

void expect_outputs(const Outputs& got, const Outputs& want, const std::string& what) {
  expect_close(got.q, want.q, what + " q");
  expect_close(got.k, want.k, what + " k");
  expect_close(got.v, want.v, what + " v");
  expect_close(got.act, want.act, what + " swiglu");
}

TEST(CudaFusedParts, PartsOfDifferentWidthsMatchUnfusedOpsAndTheCpu) {
  auto gpu = mtest::cuda_backend_or_null();
  if (!gpu) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  auto cpu = make_cpu_backend(2);
  const auto norm_h = normal(kCols, 0.3f, 99);
  std::vector<float> norm_w(norm_h);
  for (float& w : norm_w) w += 1.0f;
  for (int which : {0, 1}) {
    const Parts p = make_parts(which);
    for (int n : {1, 2, 3, 8, 40, 200}) {
      const std::string what = "case " + std::to_string(which) + " n " + std::to_string(n);
      const auto xh = normal(static_cast<size_t>(n) * kCols, 1.0f, 100 + n);
      LayerOnBackend g(*gpu, p, xh, norm_w, n), c(*cpu, p, xh, norm_w, n);
      for (bool with_norm : {false, true}) {
        const std::string w2 = what + (with_norm ? " norm" : "");
        g.fused(with_norm);
        const Outputs fused = g.read();
        g.unfused(with_norm);
        expect_outputs(fused, g.read(), w2 + " vs unfused");
        c.fused(with_norm);
        expect_outputs(fused, c.read(), w2 + " vs cpu");
      }
    }
  }
}

TEST(CudaFusedParts, DecodeStepGraphReplaysWithNewInputs) {
  auto gpu = mtest::cuda_backend_or_null();
  if (!gpu) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  if (!gpu->graph_capable()) GTEST_SKIP() << "decode graphs off (GYRE_CUDA_GRAPH=0)";
  std::vector<float> norm_w = normal(kCols, 0.3f, 98);
  for (float& w : norm_w) w += 1.0f;
  for (int which : {0, 1}) {
    SCOPED_TRACE(which);
    const Parts p = make_parts(which);
    const auto xh = normal(kCols, 1.0f, 7);
    LayerOnBackend g(*gpu, p, xh, norm_w, 1);
    const Tensor delta = input_on(*gpu, normal(kCols, 0.5f, 8), 1);
    const bool with_norm = gpu->fuses_norms(1, g.wqkv) && gpu->fuses_norms(1, g.wgu);
    EXPECT_TRUE(which == 0 || !with_norm);  // mixed parts keep their rmsnorm
    g.unfused(with_norm);                   // sizes every scratch buffer before the capture
    g.fused(with_norm);
    const int tag = 0;
    gpu->capture_begin(&tag, 0);
    g.fused(with_norm);
    gpu->capture_end(true);
    gpu->add(g.x, delta);  // the step's new input, outside the record
#ifdef GYRE_HAVE_CUDA
    const uint64_t replays = cuda_graph_replays(*gpu);
#endif
    ASSERT_TRUE(gpu->replay_step(&tag, 0));
#ifdef GYRE_HAVE_CUDA
    EXPECT_EQ(cuda_graph_replays(*gpu), replays + 1);
#endif
    const Outputs replayed = g.read();
    g.unfused(with_norm);
    expect_outputs(replayed, g.read(), "replay");
  }
}

}  // namespace
}  // namespace gyre
