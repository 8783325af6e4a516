// The CPU backend's ops against naive float64 implementations written here, on random inputs of
// awkward sizes, with a thread pool of several threads so the parallel splits are exercised.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/thread_pool.h"
#include "backend_test_util.h"
#include "core/error.h"
#include "core/half.h"

namespace gyre {
namespace {

using btest::host;

std::vector<float> random_floats(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

Tensor activation(Backend& b, int64_t rows, int64_t cols, const std::vector<float>& values) {
  Tensor t = b.alloc(rows, cols);
  EXPECT_EQ(values.size(), static_cast<size_t>(rows * cols));
  std::memcpy(t.data, values.data(), values.size() * sizeof(float));  // CPU memory is host memory
  return t;
}

TensorView view(DType dt, std::vector<int64_t> shape, const void* data, size_t nbytes) {
  TensorView v;
  v.name = "test.weight";
  v.dtype = dt;
  v.shape = std::move(shape);
  v.data = data;
  v.nbytes = nbytes;
  return v;
}

// A weight of the given plain dtype: its bytes, and the exact values those bytes hold.
struct PlainWeight {
  std::vector<uint8_t> bytes;
  std::vector<double> values;
};

PlainWeight plain_weight(DType dt, size_t n, std::mt19937& rng) {
  PlainWeight w;
  const std::vector<float> f = random_floats(n, rng);
  for (float x : f) {
    if (dt == DType::F32) {
      w.values.push_back(x);
      const auto* p = reinterpret_cast<const uint8_t*>(&x);
      w.bytes.insert(w.bytes.end(), p, p + 4);
      continue;
    }
    const uint16_t h = dt == DType::F16 ? f32_to_f16(x) : f32_to_bf16(x);
    w.values.push_back(dt == DType::F16 ? f16_to_f32(h) : bf16_to_f32(h));
    const auto* p = reinterpret_cast<const uint8_t*>(&h);
    w.bytes.insert(w.bytes.end(), p, p + 2);
  }
  return w;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want,
                  const std::vector<double>& scale, double rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::abs(got[i] - want[i]), rel * scale[i] + 1e-30)
        << what << " at " << i << ": got " << got[i] << ", want " << want[i];
}

std::vector<double> rmsnorm_ref(const std::vector<double>& x, const std::vector<float>& w,
                                int64_t rows, int64_t cols, double eps) {
  std::vector<double> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < cols; ++i) ss += x[r * cols + i] * x[r * cols + i];
    const double inv = 1.0 / std::sqrt(ss / cols + eps);
    for (int64_t i = 0; i < cols; ++i) out[r * cols + i] = x[r * cols + i] * inv * w[i];
  }
  return out;
}

TEST(CpuOpsThreadPool, CoversEveryIndexOnceAndRethrows) {
  ThreadPool pool(3);
  for (int64_t n : {1, 2, 7, 100, 1001}) {
    for (int64_t grain : {1, 3, 64}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    }
  }
  EXPECT_THROW(pool.parallel_for(100, 1,
                                 [](int64_t b, int64_t) {
                                   if (b > 50) fail("boom");
                                 }),
               Error);
  int calls = 0;
  pool.parallel_for(5, 1, [&](int64_t, int64_t) { ++calls; });  // still usable after a throw
  EXPECT_GE(calls, 1);
}

TEST(CpuOps, EmbedAllPlainDtypes) {
  auto be = make_cpu_backend(3);
  std::mt19937 rng(1);
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    for (int64_t dim : {1, 7, 130}) {
      const int64_t vocab = 11;
      PlainWeight w = plain_weight(dt, static_cast<size_t>(vocab * dim), rng);
      Tensor table = be->upload_weight(view(dt, {vocab, dim}, w.bytes.data(), w.bytes.size()));
      const std::vector<int32_t> tokens = {3, 0, 10, 3, 7};
      Tensor out = be->alloc(5, dim);
      be->embed(out, table, tokens.data(), 5);
      const std::vector<float> got = host(*be, out);
      for (size_t i = 0; i < tokens.size(); ++i)
        for (int64_t d = 0; d < dim; ++d)
          ASSERT_EQ(got[i * dim + d], w.values[tokens[i] * dim + d]);
      const int32_t bad = static_cast<int32_t>(vocab);
      Tensor one = be->alloc(1, dim);
      EXPECT_THROW(be->embed(one, table, &bad, 1), Error);
    }
  }
}

TEST(CpuOps, RmsNormAndAddRmsNorm) {
  auto be = make_cpu_backend(3);
  std::mt19937 rng(2);
  for (int64_t rows : {1, 3, 70}) {
    for (int64_t cols : {1, 7, 63, 130}) {
      const auto x = random_floats(rows * cols, rng);
      const auto delta = random_floats(rows * cols, rng);
      const auto wv = random_floats(cols, rng, 0.5f, 1.5f);
      Tensor w = be->upload_weight(view(DType::F32, {cols}, wv.data(), wv.size() * 4));
      Tensor xt = activation(*be, rows, cols, x), out = be->alloc(rows, cols);
      be->rmsnorm(out, xt, w, 1e-5f);
      std::vector<double> xd(x.begin(), x.end());
      std::vector<double> want = rmsnorm_ref(xd, wv, rows, cols, 1e-5);
      std::vector<double> scale(want.size());
      for (size_t i = 0; i < want.size(); ++i) scale[i] = std::max(1.0, std::abs(want[i]));
      expect_close(host(*be, out), want, scale, 1e-5, "rmsnorm");

      Tensor dt = activation(*be, rows, cols, delta);
      be->add_rmsnorm(xt, out, dt, w, 1e-5f);
      for (size_t i = 0; i < xd.size(); ++i) xd[i] += delta[i];
      want = rmsnorm_ref(xd, wv, rows, cols, 1e-5);
      for (size_t i = 0; i < want.size(); ++i) scale[i] = std::max(1.0, std::abs(want[i]));
      expect_close(host(*be, out), want, scale, 1e-5, "add_rmsnorm out");
      std::vector<double> ones(xd.size(), 1.0);
      expect_close(host(*be, xt), xd, ones, 1e-6, "add_rmsnorm residual");
    }
  }
}

TEST(CpuOps, SiluMulAndAdd) {
  auto be = make_cpu_backend(3);
  std::mt19937 rng(3);
  for (int64_t rows : {1, 5}) {
    for (int64_t cols : {1, 63, 130}) {
      const auto g = random_floats(rows * cols, rng, -8, 8), u = random_floats(rows * cols, rng);
      Tensor gt = activation(*be, rows, cols, g), ut = activation(*be, rows, cols, u);
      be->silu_mul(gt, gt, ut);  // in place over gate, as the forward pass does
      std::vector<double> want(g.size()), scale(g.size());
      for (size_t i = 0; i < g.size(); ++i) {
        want[i] = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
        scale[i] = std::max(1e-3, std::abs(want[i]));
      }
      expect_close(host(*be, gt), want, scale, 1e-5, "silu_mul");
      be->add(gt, ut);
      for (size_t i = 0; i < g.size(); ++i) want[i] += u[i], scale[i] = 1.0;
      expect_close(host(*be, gt), want, scale, 1e-5, "add");
    }
  }
  Tensor a = be->alloc(2, 3), b = be->alloc(3, 2);
  EXPECT_THROW(be->add(a, b), Error);
}

// out[t, o] = x[t] . w[o] (+ bias[o]), checked to 1e-5 of sum |x_i w_i|.
void check_matmul(Backend& be, const Tensor& w, const std::vector<double>& wv, int64_t n,
                  int64_t in, int64_t out_dim, std::mt19937& rng, bool with_bias,
                  const std::string& what) {
  const auto x = random_floats(n * in, rng);
  const auto bias = random_floats(out_dim, rng);
  Tensor bt = be.upload_weight(view(DType::F32, {out_dim}, bias.data(), bias.size() * 4));
  Tensor xt = activation(be, n, in, x), ot = be.alloc(n, out_dim);
  be.matmul(ot, xt, w, with_bias ? &bt : nullptr);
  std::vector<double> want(static_cast<size_t>(n * out_dim)), scale(want.size());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t o = 0; o < out_dim; ++o) {
      double s = with_bias ? bias[o] : 0.0, a = with_bias ? std::abs(bias[o]) : 0.0;
      for (int64_t i = 0; i < in; ++i) {
        s += static_cast<double>(x[t * in + i]) * wv[o * in + i];
        a += std::abs(x[t * in + i] * wv[o * in + i]);
      }
      want[t * out_dim + o] = s;
      scale[t * out_dim + o] = a;
    }
  const std::vector<float> got = host(be, ot);
  expect_close(got, want, scale, 1e-5, what);
  // Each token alone gives bit-identical rows: the summation order does not depend on the batch.
  for (int64_t t = 0; t < n; t += std::max<int64_t>(1, n / 3)) {
    Tensor one = be.alloc(1, out_dim);
    be.matmul(one, xt.slice_rows(t, 1), w, with_bias ? &bt : nullptr);
    const std::vector<float> row = host(be, one);
    for (int64_t o = 0; o < out_dim; ++o) ASSERT_EQ(row[o], got[t * out_dim + o]) << what;
  }
}

TEST(CpuOps, MatmulPlainDtypesAwkwardSizes) {
  auto be = make_cpu_backend(3);
  std::mt19937 rng(4);
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (int64_t in : {1, 7, 63, 130})
      for (int64_t out_dim : {1, 7, 130})
        for (int64_t n : {1, 3, 70}) {
          PlainWeight w = plain_weight(dt, static_cast<size_t>(in * out_dim), rng);
          Tensor wt = be->upload_weight(view(dt, {out_dim, in}, w.bytes.data(), w.bytes.size()));
          EXPECT_EQ(wt.data, w.bytes.data()) << "plain weights are used in place";
          check_matmul(*be, wt, w.values, n, in, out_dim, rng, n != 3,
                       std::string(dtype_name(dt)) + " " + std::to_string(n) + "x" +
                           std::to_string(in) + "->" + std::to_string(out_dim));
        }
}

TEST(CpuOps, MatmulLargeBlocksAndMisalignedWeights) {
  auto be = make_cpu_backend(3);
  std::mt19937 rng(5);
  // Long rows: several row groups and token blocks.
  for (DType dt : {DType::F32, DType::F16}) {
    PlainWeight w = plain_weight(dt, 2100 * 70, rng);
    Tensor wt = be->upload_weight(view(dt, {70, 2100}, w.bytes.data(), w.bytes.size()));
    check_matmul(*be, wt, w.values, 150, 2100, 70, rng, false, "large");
  }
  // Weights at every byte offset: misaligned ones are copied, aligned ones used in place.
  for (DType dt : {DType::F32, DType::F16, DType::BF16})
    for (size_t offset = 0; offset < 4; ++offset) {
      PlainWeight w = plain_weight(dt, 9 * 33, rng);
      std::vector<uint8_t> buf(w.bytes.size() + 8);
      const size_t base = (8 - reinterpret_cast<uintptr_t>(buf.data()) % 8) % 8;
      uint8_t* p = buf.data() + base + offset;
      if (p + w.bytes.size() > buf.data() + buf.size()) continue;
      std::memcpy(p, w.bytes.data(), w.bytes.size());
      Tensor wt = be->upload_weight(view(dt, {9, 33}, p, w.bytes.size()));
      check_matmul(*be, wt, w.values, 5, 33, 9, rng, true, "offset " + std::to_string(offset));
    }
}

// Random blocks of a quantized type with a sane f16 scale (random scale bytes could be NaN).
std::vector<uint8_t> random_blocks(DType dt, int64_t n_elems, std::mt19937& rng) {
  const DTypeInfo& info = dtype_info(dt);
  std::vector<uint8_t> bytes(static_cast<size_t>(n_elems / info.block_elems * info.block_bytes));
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  const uint16_t d = f32_to_f16(0.01f), m = f32_to_f16(-0.02f);
  for (size_t b = 0; b < bytes.size(); b += static_cast<size_t>(info.block_bytes)) {
    uint8_t* blk = &bytes[b];
    if (dt == DType::Q6_K) {
      std::memcpy(blk + 208, &d, 2);  // ql[128], qh[64], scales[16], d
    } else {
      std::memcpy(blk, &d, 2);  // every other layout starts with d (then dmin/m when present)
      if (dt != DType::Q8_0 && dt != DType::Q4_0) std::memcpy(blk + 2, &m, 2);
    }
  }
  return bytes;
}

TEST(CpuOps, MatmulQuantizedHandBuiltQ8AndQ4) {
  // Values decoded here from the GGUF layouts, independently of core/quant_blocks.
  auto be = make_cpu_backend(3);
  std::mt19937 rng(6);
  const int64_t rows = 7, cols = 96;
  for (DType dt : {DType::Q8_0, DType::Q4_0}) {
    std::vector<uint8_t> bytes = random_blocks(dt, rows * cols, rng);
    const int bb = dtype_info(dt).block_bytes;
    std::vector<double> values;
    for (size_t b = 0; b < bytes.size(); b += static_cast<size_t>(bb)) {
      uint16_t dh;
      std::memcpy(&dh, &bytes[b], 2);
      const double d = f16_to_f32(dh);
      double v[32];
      for (int i = 0; i < 32; ++i)
        v[i] = dt == DType::Q8_0
                   ? d * static_cast<int8_t>(bytes[b + 2 + i])
                   : d * ((i < 16 ? bytes[b + 2 + i] & 15 : bytes[b + 2 + i - 16] >> 4) - 8);
      values.insert(values.end(), v, v + 32);
    }
    Tensor wt = be->upload_weight(view(dt, {rows, cols}, bytes.data(), bytes.size()));
    EXPECT_EQ(wt.dtype, DType::F32);
    check_matmul(*be, wt, values, 4, cols, rows, rng, false, dtype_name(dt));
  }
}

TEST(CpuOps, MatmulEveryQuantizedTypeThroughDequantizeRow) {
  auto be = make_cpu_backend(3);
  std::mt19937 rng(7);
  for (DType dt : {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    const int64_t rows = 5, cols = 512;
    std::vector<uint8_t> bytes = random_blocks(dt, rows * cols, rng);
    // Misaligned by one byte, as a GGUF tensor may be.
    std::vector<uint8_t> shifted(bytes.size() + 1);
    std::memcpy(shifted.data() + 1, bytes.data(), bytes.size());
    std::vector<float> deq(static_cast<size_t>(rows * cols));
    const size_t rb = dtype_row_bytes(dt, cols);
    for (int64_t r = 0; r < rows; ++r) dequantize_row(dt, &bytes[r * rb], &deq[r * cols], cols);
    Tensor wt = be->upload_weight(view(dt, {rows, cols}, shifted.data() + 1, bytes.size()));
    check_matmul(*be, wt, std::vector<double>(deq.begin(), deq.end()), 3, cols, rows, rng, true,
                 dtype_name(dt));
  }
}

TEST(CpuOps, BadWeightsAndShapesThrow) {
  auto be = make_cpu_backend(1);
  std::vector<float> w(12);
  EXPECT_THROW(be->upload_weight(view(DType::F32, {3, 4}, w.data(), 40)), Error);
  EXPECT_THROW(be->upload_weight(view(DType::I32, {3, 4}, w.data(), 48)), Error);
  EXPECT_THROW(be->upload_weight(view(DType::Q8_0, {1, 12}, w.data(), 48)), Error);
  Tensor wt = be->upload_weight(view(DType::F32, {3, 4}, w.data(), 48));
  Tensor x = be->alloc(2, 5), out = be->alloc(2, 3);
  EXPECT_THROW(be->matmul(out, x, wt, nullptr), Error);
}

}  // namespace
}  // namespace gyre
