// Fused projections (Backend::upload_fused, matmul_split, matmul_swiglu) and the decode fusions
// (norm_matmul_split, norm_matmul_swiglu, matmul_add). Oracles: a naive
// float64 computation for the CPU backend's defaults and the host interleave; for CUDA, the CPU
// backend (FP16 weights) and the CUDA backend's own unfused ops on separately uploaded weights
// (quantized weights: requantizing the fused rows gives the same values as the separate rows).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/fused_weights.h"
#include "backend_test_util.h"
#include "core/half.h"
#ifdef GYRE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace gyre {
namespace {

using btest::host;

struct HostWeight {
  std::vector<float> v;
  TensorView view(const std::string& name, int64_t rows, int64_t cols) const {
    TensorView t;
    t.name = name;
    t.dtype = DType::F32;
    t.shape = rows == 0 ? std::vector<int64_t>{cols} : std::vector<int64_t>{rows, cols};
    t.data = v.data();
    t.nbytes = v.size() * sizeof(float);
    return t;
  }
};

HostWeight random_weight(size_t n, std::mt19937& rng, float scale) {
  std::uniform_real_distribution<float> u(-scale, scale);
  HostWeight w;
  w.v.resize(n);
  for (float& x : w.v) x = f16_to_f32(f32_to_f16(u(rng)));  // exact in FP16 too
  return w;
}

// y[t, r] = x[t] . w[r] (+ b[r]) in float64.
std::vector<double> naive_matmul(const std::vector<float>& x, const std::vector<float>& w,
                                 const float* b, int n, int rows, int cols) {
  std::vector<double> y(static_cast<size_t>(n) * rows);
  for (int t = 0; t < n; ++t)
    for (int r = 0; r < rows; ++r) {
      double s = b ? b[r] : 0.0;
      for (int c = 0; c < cols; ++c)
        s += static_cast<double>(x[static_cast<size_t>(t) * cols + c]) *
             w[static_cast<size_t>(r) * cols + c];
      y[static_cast<size_t>(t) * rows + r] = s;
    }
  return y;
}

using btest::rel_error;

[[maybe_unused]] std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

double silu(double g) {
  return g / (1.0 + std::exp(-g));
}

// Q/K/V and gate/up of one small layer, with the naive results for n tokens.
struct Layer {
  int n, dim, q_rows, kv_rows, hidden;
  HostWeight x, wq, wk, wv, bq, bk, bv, gate, up;
  Layer(int n_, int dim_, int q_, int kv_, int hidden_, std::mt19937& rng)
      : n(n_), dim(dim_), q_rows(q_), kv_rows(kv_), hidden(hidden_) {
    const float s = 1.0f / std::sqrt(static_cast<float>(dim));
    x = random_weight(static_cast<size_t>(n) * dim, rng, 1.0f);
    wq = random_weight(static_cast<size_t>(q_rows) * dim, rng, s);
    wk = random_weight(static_cast<size_t>(kv_rows) * dim, rng, s);
    wv = random_weight(static_cast<size_t>(kv_rows) * dim, rng, s);
    bq = random_weight(q_rows, rng, 0.5f);
    bk = random_weight(kv_rows, rng, 0.5f);
    bv = random_weight(kv_rows, rng, 0.5f);
    gate = random_weight(static_cast<size_t>(hidden) * dim, rng, 2 * s);
    up = random_weight(static_cast<size_t>(hidden) * dim, rng, 2 * s);
  }
  std::vector<TensorView> qkv() const {
    return {wq.view("l.q_proj.weight", q_rows, dim), wk.view("l.k_proj.weight", kv_rows, dim),
            wv.view("l.v_proj.weight", kv_rows, dim)};
  }
  std::vector<TensorView> biases() const {
    return {bq.view("l.q_proj.bias", 0, q_rows), bk.view("l.k_proj.bias", 0, kv_rows),
            bv.view("l.v_proj.bias", 0, kv_rows)};
  }
  std::vector<TensorView> gate_up() const {
    return {gate.view("l.gate_proj.weight", hidden, dim), up.view("l.up_proj.weight", hidden, dim)};
  }
  std::vector<double> swiglu() const {
    const auto g = naive_matmul(x.v, gate.v, nullptr, n, hidden, dim);
    const auto u = naive_matmul(x.v, up.v, nullptr, n, hidden, dim);
    std::vector<double> y(g.size());
    for (size_t i = 0; i < y.size(); ++i) y[i] = silu(g[i]) * u[i];
    return y;
  }
};

Tensor activation(Backend& b, const HostWeight& x, int n, int dim) {
  // Activations enter through a weight upload of the same shape (FP16 on CUDA, F32 on CPU).
  return b.upload_weight(x.view("x", n, dim));
}

TEST(FusedWeights, InterleaveLayoutPadsWithZeros) {
  std::vector<float> g(13 * 2), u(13 * 2);
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = static_cast<float>(i + 1);
    u[i] = -static_cast<float>(i + 1);
  }
  HostWeight hg{g}, hu{u};
  std::vector<uint8_t> storage;
  const TensorView v = fuse_views({hg.view("g", 13, 2), hu.view("u", 13, 2)}, 8, storage);
  ASSERT_EQ(v.shape, (std::vector<int64_t>{32, 2}));
  const float* f = static_cast<const float*>(v.data);
  for (int r = 0; r < 16; ++r) {  // hidden row r: gate at 16(r/8) + r%8, up 8 rows later
    const int gi = 16 * (r / 8) + r % 8;
    const float want_g = r < 13 ? g[static_cast<size_t>(2 * r)] : 0.0f;
    EXPECT_EQ(f[2 * gi], want_g) << r;
    EXPECT_EQ(f[2 * (gi + 8)], -want_g) << r;
  }
}

TEST(FusedWeights, CpuDefaultsMatchNaive) {
  std::mt19937 rng(7);
  auto cpu = make_cpu_backend(2);
  for (int n : {1, 5}) {
    Layer l(n, 48, 24, 8, 13, rng);
    Tensor x = activation(*cpu, l.x, n, l.dim);
    Tensor w = cpu->upload_fused(l.qkv(), FusedKind::Concat);
    Tensor b = cpu->upload_fused(l.biases(), FusedKind::Concat);
    Tensor q = cpu->alloc(n, l.q_rows), k = cpu->alloc(n, l.kv_rows), v = cpu->alloc(n, l.kv_rows);
    cpu->matmul_split({&q, &k, &v}, x, w, &b);
    EXPECT_LT(rel_error(host(*cpu, q), naive_matmul(l.x.v, l.wq.v, l.bq.v.data(), n, 24, 48)),
              1e-5);
    EXPECT_LT(rel_error(host(*cpu, k), naive_matmul(l.x.v, l.wk.v, l.bk.v.data(), n, 8, 48)), 1e-5);
    EXPECT_LT(rel_error(host(*cpu, v), naive_matmul(l.x.v, l.wv.v, l.bv.v.data(), n, 8, 48)), 1e-5);
    Tensor gu = cpu->upload_fused(l.gate_up(), FusedKind::GateUp);
    Tensor out = cpu->alloc(n, l.hidden);
    cpu->matmul_swiglu(out, x, gu);
    EXPECT_LT(rel_error(host(*cpu, out), l.swiglu()), 1e-5);
  }
}

// The decode fusions' defaults (separate ops) on the CPU backend against float64.
TEST(FusedWeights, CpuNormAndResidualDefaultsMatchNaive) {
  std::mt19937 rng(8);
  auto cpu = make_cpu_backend(2);
  const int n = 3;
  const float eps = 1e-5f;
  Layer l(n, 48, 24, 8, 13, rng);
  const HostWeight nw = random_weight(48, rng, 1.5f), r0 = random_weight(n * 24, rng, 1.0f);
  std::vector<float> xn(l.x.v.size());
  for (int t = 0; t < n; ++t) {
    double ss = 0;
    for (int c = 0; c < 48; ++c)
      ss += double(l.x.v[size_t(t) * 48 + c]) * l.x.v[size_t(t) * 48 + c];
    const double inv = 1.0 / std::sqrt(ss / 48 + eps);
    for (int c = 0; c < 48; ++c)
      xn[size_t(t) * 48 + c] = static_cast<float>(l.x.v[size_t(t) * 48 + c] * inv * nw.v[c]);
  }
  Tensor x = activation(*cpu, l.x, n, l.dim), norm = cpu->upload_weight(nw.view("norm", 0, 48));
  Tensor w = cpu->upload_fused(l.qkv(), FusedKind::Concat);
  Tensor q = cpu->alloc(n, 24), k = cpu->alloc(n, 8), v = cpu->alloc(n, 8),
         scratch = cpu->alloc(n, 48);
  EXPECT_FALSE(cpu->fuses_norms(n, w));
  cpu->norm_matmul_split({&q, &k, &v}, {x, norm, eps, scratch}, w, nullptr);
  EXPECT_LT(rel_error(host(*cpu, q), naive_matmul(xn, l.wq.v, nullptr, n, 24, 48)), 1e-5);
  EXPECT_LT(rel_error(host(*cpu, v), naive_matmul(xn, l.wv.v, nullptr, n, 8, 48)), 1e-5);
  Tensor gu = cpu->upload_fused(l.gate_up(), FusedKind::GateUp), out = cpu->alloc(n, 13);
  cpu->norm_matmul_swiglu(out, {x, norm, eps, scratch}, gu);
  const auto g = naive_matmul(xn, l.gate.v, nullptr, n, 13, 48),
             u = naive_matmul(xn, l.up.v, nullptr, n, 13, 48);
  std::vector<double> want(g.size());
  for (size_t i = 0; i < g.size(); ++i) want[i] = silu(g[i]) * u[i];
  EXPECT_LT(rel_error(host(*cpu, out), want), 1e-5);
  // (The CPU backend may wrap an F32 upload without copying: the expectation comes first.)
  std::vector<double> want_res = naive_matmul(l.x.v, l.wq.v, nullptr, n, 24, 48);
  for (size_t i = 0; i < want_res.size(); ++i) want_res[i] += r0.v[i];
  Tensor wq = cpu->upload_weight(l.qkv()[0]), res = activation(*cpu, r0, n, 24);
  Tensor tmp = cpu->alloc(n, 24);
  cpu->matmul_add(res, x, wq, tmp);
  EXPECT_LT(rel_error(host(*cpu, res), want_res), 1e-5);
}

#ifdef GYRE_HAVE_CUDA

// Each path of the CUDA fused ops (GEMV epilogues n <= 8, qlinear GEMM n < 64, cuBLAS beyond)
// for FP16, 8-bit and 4-bit weights, against the unfused ops of the same backend and (FP16) the
// float64 reference.
TEST(CudaFused, SplitAndSwigluMatchUnfusedOps) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(11);
  for (int bits : {0, 8, 4}) {
    BackendOptions o;
    o.weight_bits = bits;
    auto gpu = make_cuda_backend(0, o);
    for (int n : {1, 3, 8, 20, 70}) {
      for (int hidden : {48, 52}) {
        SCOPED_TRACE("bits " + std::to_string(bits) + " n " + std::to_string(n) + " hidden " +
                     std::to_string(hidden));
        Layer l(n, 256, 96, 32, hidden, rng);
        Tensor x = activation(*gpu, l.x, n, l.dim);
        Tensor w = gpu->upload_fused(l.qkv(), FusedKind::Concat);
        Tensor b = gpu->upload_fused(l.biases(), FusedKind::Concat);
        Tensor q = gpu->alloc(n, l.q_rows), k = gpu->alloc(n, l.kv_rows),
               v = gpu->alloc(n, l.kv_rows);
        gpu->matmul_split({&q, &k, &v}, x, w, &b);
        const auto parts = l.qkv();
        const auto biases = l.biases();
        Tensor* outs[] = {&q, &k, &v};
        for (int i = 0; i < 3; ++i) {
          Tensor wi = gpu->upload_weight(parts[static_cast<size_t>(i)]);
          Tensor bi = gpu->upload_weight(biases[static_cast<size_t>(i)]);
          Tensor ref = gpu->alloc(n, outs[i]->cols);
          gpu->matmul(ref, x, wi, &bi);
          EXPECT_LT(rel_error(host(*gpu, *outs[i]), to_double(host(*gpu, ref))), 2e-3) << i;
        }
        if (bits == 0) {
          EXPECT_LT(
              rel_error(host(*gpu, q), naive_matmul(l.x.v, l.wq.v, l.bq.v.data(), n, 96, l.dim)),
              3e-3);
        }

        Tensor gu = gpu->upload_fused(l.gate_up(), FusedKind::GateUp);
        Tensor out = gpu->alloc(n, hidden);
        gpu->matmul_swiglu(out, x, gu);
        const auto gv = l.gate_up();
        Tensor wg = gpu->upload_weight(gv[0]), wu = gpu->upload_weight(gv[1]);
        Tensor rg = gpu->alloc(n, hidden), ru = gpu->alloc(n, hidden);
        gpu->matmul(rg, x, wg, nullptr);
        gpu->matmul(ru, x, wu, nullptr);
        gpu->silu_mul(rg, rg, ru);
        EXPECT_LT(rel_error(host(*gpu, out), to_double(host(*gpu, rg))), 3e-3);
        if (bits == 0) {
          EXPECT_LT(rel_error(host(*gpu, out), l.swiglu()), 5e-3);
        }
      }
    }
  }
}

// The decode fusions (Backend::fuses_norms): the RMSNorm folded into the matmul's input and the
// residual add into its output, against the same backend's separate ops. 4-bit weights take the
// fused kernels at n <= 2, tiled 8-bit weights (the default layout) up to n = 4 (the stream GEMV;
// the serving-batch kernel from 5 rows does not fuse); other weights and row counts the defaults
// (separate ops again).
TEST(CudaFused, NormAndResidualFusionsMatchSeparateOps) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(12);
  const float eps = 1e-5f;
  for (int bits : {0, 8, 4}) {
    BackendOptions o;
    o.weight_bits = bits;
    auto gpu = make_cuda_backend(0, o);
    for (int n : {1, 2, 3, 8, 20}) {
      SCOPED_TRACE("bits " + std::to_string(bits) + " n " + std::to_string(n));
      Layer l(n, 256, 96, 32, 52, rng);
      const HostWeight nw = random_weight(static_cast<size_t>(l.dim), rng, 1.5f);
      const HostWeight r0 = random_weight(static_cast<size_t>(n) * l.q_rows, rng, 1.0f);
      Tensor x = activation(*gpu, l.x, n, l.dim);
      Tensor norm = gpu->upload_weight(nw.view("norm", 0, l.dim));
      Tensor w = gpu->upload_fused(l.qkv(), FusedKind::Concat);
      Tensor b = gpu->upload_fused(l.biases(), FusedKind::Concat);
      Tensor gu = gpu->upload_fused(l.gate_up(), FusedKind::GateUp);
      const bool fused = (bits == 4 && n <= 2) || (bits == 8 && n <= 4);
      EXPECT_EQ(gpu->fuses_norms(n, w), fused);
      EXPECT_EQ(gpu->fuses_norms(n, gu), fused);
      Tensor scratch = gpu->alloc(n, l.dim), xn = gpu->alloc(n, l.dim);
      gpu->rmsnorm(xn, x, norm, eps);

      Tensor q = gpu->alloc(n, l.q_rows), k = gpu->alloc(n, l.kv_rows),
             v = gpu->alloc(n, l.kv_rows);
      Tensor rq = gpu->alloc(n, l.q_rows), rk = gpu->alloc(n, l.kv_rows),
             rv = gpu->alloc(n, l.kv_rows);
      gpu->norm_matmul_split({&q, &k, &v}, {x, norm, eps, scratch}, w, &b);
      gpu->matmul_split({&rq, &rk, &rv}, xn, w, &b);
      EXPECT_LT(rel_error(host(*gpu, q), to_double(host(*gpu, rq))), 2e-3);
      EXPECT_LT(rel_error(host(*gpu, k), to_double(host(*gpu, rk))), 2e-3);
      EXPECT_LT(rel_error(host(*gpu, v), to_double(host(*gpu, rv))), 2e-3);

      Tensor out = gpu->alloc(n, l.hidden), rout = gpu->alloc(n, l.hidden);
      gpu->norm_matmul_swiglu(out, {x, norm, eps, scratch}, gu);
      gpu->matmul_swiglu(rout, xn, gu);
      EXPECT_LT(rel_error(host(*gpu, out), to_double(host(*gpu, rout))), 3e-3);

      Tensor wq = gpu->upload_weight(l.qkv()[0]);
      Tensor res = activation(*gpu, r0, n, l.q_rows), rres = activation(*gpu, r0, n, l.q_rows);
      Tensor tmp = gpu->alloc(n, l.q_rows), rtmp = gpu->alloc(n, l.q_rows);
      gpu->matmul_add(res, x, wq, tmp);
      gpu->matmul(rtmp, x, wq, nullptr);
      gpu->add(rres, rtmp);
      EXPECT_LT(rel_error(host(*gpu, res), to_double(host(*gpu, rres))), 2e-3);
    }
  }
}

#endif

}  // namespace
}  // namespace gyre
