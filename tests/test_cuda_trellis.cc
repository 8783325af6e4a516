// Trellis-coded weights on CUDA (qlinear_trellis.cu) against the CPU reference: the
// dequantization bit-exact against qweight_dequantize_row (trellis_layout.cc), the GEMV (every
// K, groups 16..128, awkward shapes, n = 1..8, 17 and 40) and from 5 rows the serving-batch
// kernel (qlinear_batch_stream.cu, up to 128 rows) against float64 products of that reference,
// the split / SwiGLU / accumulate epilogues on both, and CudaBackend::matmul on a rotated QPACKED
// view (decode GEMV, batch kernel, and the dequantize + cuBLAS path). Skipped without a GPU.
#include <gtest/gtest.h>

#ifdef GYRE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/qlinear_ref.h"
#include "backend/cpu/trellis.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/qlinear.h"
#include "backend_test_util.h"
#include "core/half.h"
#include "qlinear_test_util.h"

namespace gyre {
namespace {

using namespace qtest;

// Random tile words (every bit pattern is a valid trellis stream) and positive f16 scales that
// give rows of about unit RMS.
QWeightHost make_trellis(int rows, int cols, int k, int group, uint32_t seed) {
  QWeightHost w;
  w.desc.bits = k;
  w.desc.group_size = group;
  w.desc.rows = rows;
  w.desc.cols = cols;
  w.desc.trellis = true;
  std::mt19937 rng(seed);
  w.qweight.resize(static_cast<size_t>(w.desc.qweight_bytes()));
  for (auto& b : w.qweight) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  const float unit = 1.0f / (static_cast<float>(kTrellisCodeRms) * std::sqrt(float(cols)));
  w.scales.resize(static_cast<size_t>(w.desc.scale_count()) * 2);
  for (size_t i = 0; i < w.scales.size() / 2; ++i) {
    const uint16_t h = f32_to_f16(u(rng) * unit);
    std::memcpy(w.scales.data() + 2 * i, &h, 2);
  }
  qweight_validate(w.desc);
  return w;
}

std::string label(const QWeightHost& w) {
  return "K " + std::to_string(w.desc.bits) + " [" + std::to_string(w.desc.rows) + ", " +
         std::to_string(w.desc.cols) + "] group " + std::to_string(w.desc.group_size);
}

// The device dequantization equals the host reference rounded to f16, element for element.
void check_dequant(const QWeightHost& w, const QWeightDevice& dw) {
  const int rows = w.desc.rows, cols = w.desc.cols;
  DeviceHalves out(size_t(rows) * cols);
  out.poison();
  qlinear_dequantize(dw, out.p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> got = out.download();
  std::vector<float> row(cols);
  for (int r = 0; r < rows; ++r) {
    qweight_dequantize_row(w, r, row.data());
    for (int c = 0; c < cols; ++c)
      ASSERT_EQ(got[size_t(r) * cols + c], f32_to_f16(row[c])) << "row " << r << " col " << c;
  }
}

void check_matmul(const QWeightHost& w, const QWeightDevice& dw, const std::vector<uint16_t>& xh,
                  const Reference& ref, int n) {
  SCOPED_TRACE(label(w) + " n " + std::to_string(n));
  const int rows = w.desc.rows, cols = w.desc.cols;
  DeviceHalves x(size_t(n) * cols), y(size_t(n) * rows);
  x.upload(xh);
  y.poison();
  qlinear_matmul(dw, x.p, y.p, n, nullptr, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const size_t count = size_t(n) * rows;
  expect_close(y.download(count), std::vector<double>(ref.y.begin(), ref.y.begin() + count),
               std::vector<double>(ref.mag.begin(), ref.mag.begin() + count));
}

struct Case {
  int rows, cols, group, max_n;
};

TEST(CudaTrellis, DequantAndGemvMatchReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  // Partial 64-column pieces (32, 96, 1040 columns), groups of one tile up to 8 tiles, a split
  // range inside a group (4096 columns, many rows: no split-K; few rows: split-K).
  const Case cases[] = {{16, 32, 16, 128},  {48, 96, 32, 128},   {272, 1040, 16, 128},
                        {48, 4096, 128, 8}, {272, 4096, 64, 40}, {16, 96, 16, 40}};
  const int ks[] = {2, 3, 4, 5, 6, 8};
  uint32_t seed = 100;
  for (const int k : ks) {
    for (const Case& c : cases) {
      const QWeightHost w = make_trellis(c.rows, c.cols, k, c.group, seed++);
      SCOPED_TRACE(label(w));
      QWeightDevice dw = qweight_upload(w);
      check_dequant(w, dw);
      const std::vector<uint16_t> xh = random_halves(size_t(c.max_n) * c.cols, 1.0f, seed++);
      const Reference ref = reference(w, xh, nullptr, c.max_n);
      // From 5 rows the serving-batch kernel (qlinear_batch_stream.cu), then the GEMV per 8
      // tokens with it off; 64, 65 and 128 rows: one and two passes of 64.
      for (const int batch : {-1, 0}) {
        qlinear_detail::set_bits_batch(batch);
        for (const int n : {1, 2, 5, 8, 17, 40, 64, 65, 128})
          if (n <= c.max_n && (batch == -1 || n <= 40)) check_matmul(w, dw, xh, ref, n);
        qlinear_detail::set_bits_batch(-1);
        if (HasFatalFailure()) break;
      }
      qweight_free(dw);
    }
  }
}

// The largest rows of the brief (4112 = 257 tiles) at K = 4 and 3 and the decode token counts.
TEST(CudaTrellis, TallWeight) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int k : {4, 3}) {
    const QWeightHost w = make_trellis(4112, 1024, k, 128, 900u + k);
    QWeightDevice dw = qweight_upload(w);
    check_dequant(w, dw);
    const std::vector<uint16_t> xh = random_halves(size_t(8) * 1024, 1.0f, 901u + k);
    const Reference ref = reference(w, xh, nullptr, 8);
    for (const int n : {1, 8}) check_matmul(w, dw, xh, ref, n);
    qweight_free(dw);
  }
}

void check_epilogues(int batch);

// Split outputs (Q|K|V) with a bias, SwiGLU on an 8-row interleaved gate/up weight, and
// y += x . W, each against the float64 reference.
TEST(CudaTrellis, Epilogues) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const AtExit reset([] { qlinear_detail::set_bits_batch(-1); });
  for (const int batch : {-1, 0}) {  // 5 rows: the serving-batch kernel, then the GEMV
    qlinear_detail::set_bits_batch(batch);
    check_epilogues(batch);
    if (HasFatalFailure()) return;
  }
}

void check_epilogues(int batch) {
  SCOPED_TRACE("batch kernel " + std::to_string(batch));
  const int rows = 96, cols = 160, n = 5, hidden = rows / 2;
  const QWeightHost w = make_trellis(rows, cols, 4, 32, 77);
  QWeightDevice dw = qweight_upload(w);
  const std::vector<uint16_t> xh = random_halves(size_t(n) * cols, 1.0f, 78);
  const std::vector<uint16_t> bh = random_halves(rows, 0.5f, 79);
  const Reference ref = reference(w, xh, &bh, n), plain = reference(w, xh, nullptr, n);
  DeviceHalves x(size_t(n) * cols), bias(rows), y(size_t(n) * rows);
  x.upload(xh);
  bias.upload(bh);

  // Q|K|V of 48, 16 and 32 rows.
  const int ends[3] = {48, 64, 96};
  DeviceHalves q(size_t(n) * 48), kk(size_t(n) * 16), v(size_t(n) * 32);
  cuda::OutSplit split;
  split.parts = 3;
  split.out[0] = q.p;
  split.out[1] = kk.p;
  split.out[2] = v.p;
  for (int i = 0; i < 3; ++i) split.end[i] = ends[i];
  qlinear_matmul_split(dw, x.p, split, n, bias.p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> parts[3] = {q.download(), kk.download(), v.download()};
  for (int t = 0; t < n; ++t)
    for (int r = 0; r < rows; ++r) {
      const int part = r < 48 ? 0 : r < 64 ? 1 : 2, start = part == 0 ? 0 : ends[part - 1];
      const int width = ends[part] - start;
      const size_t i = size_t(t) * rows + r;
      EXPECT_NEAR(f16_to_f32(parts[part][size_t(t) * width + r - start]), ref.y[i],
                  4e-3 * ref.mag[i] + 1e-3)
          << "split t " << t << " row " << r;
    }

  // SwiGLU: fused rows 16b..16b+7 are gate rows, 16b+8..16b+15 the matching up rows.
  DeviceHalves out(size_t(n) * hidden);
  ASSERT_TRUE(qlinear_gemv_swiglu(dw, x.p, out.p, n, hidden, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> got = out.download();
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < hidden; ++h) {
      const int gate_row = 16 * (h / 8) + h % 8, up_row = gate_row + 8;
      const double gate = plain.y[size_t(t) * rows + gate_row];
      const double up = plain.y[size_t(t) * rows + up_row];
      const double want = gate / (1.0 + std::exp(-gate)) * up;
      const double tol = 5e-3 * (plain.mag[size_t(t) * rows + gate_row] * std::fabs(up) +
                                 plain.mag[size_t(t) * rows + up_row] * std::fabs(gate)) +
                         1e-3;
      EXPECT_NEAR(f16_to_f32(got[size_t(t) * hidden + h]), want, tol) << "swiglu t " << t;
    }

  // Accumulate: y starts as the bias broadcast, so y + x . W equals the biased reference.
  std::vector<uint16_t> yh(size_t(n) * rows);
  for (int t = 0; t < n; ++t)
    for (int r = 0; r < rows; ++r) yh[size_t(t) * rows + r] = bh[r];
  y.upload(yh);
  QlinearFusion f;
  f.accumulate = true;
  qlinear_matmul(dw, x.p, y.p, n, nullptr, nullptr, f);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_close(y.download(), ref.y, ref.mag);
  qweight_free(dw);
}

// Through the backend: a rotated trellis weight as a QPACKED view (x is rotated by the backend
// before the GEMV), 1 token on the trellis GEMV, 5 to 40 on the batch kernel, 200 on dequantize +
// cuBLAS.
TEST(CudaTrellis, BackendMatmulOnRotatedView) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int rows = 272, cols = 512;
  const int block = hadamard_block_for(cols);
  QWeightHost w = make_trellis(rows, cols, 4, block, 31);
  w.had = HadamardRotation{hadamard_random_signs(cols, 32), block};
  auto b = make_cuda_backend(0, BackendOptions{});
  const Tensor wt = b->upload_weight(qweight_view("model.layers.0.mlp.down_proj.weight", w));
  for (const int n : {1, 5, 17, 40, 200}) {
    SCOPED_TRACE("n " + std::to_string(n));
    std::mt19937 rng(n);
    const std::vector<float> x = btest::random_f16(size_t(n) * cols, rng);
    std::vector<uint16_t> xh(x.size());
    for (size_t i = 0; i < x.size(); ++i) xh[i] = f32_to_f16(x[i]);
    const Reference ref = reference(w, xh, nullptr, n);  // dequantize_row undoes the rotation
    const btest::Act xa = btest::upload(*b, x, n, cols);
    Tensor y = b->alloc(n, rows);
    b->matmul(y, xa.t, wt, nullptr);
    expect_backend_close(btest::host(*b, y), ref);
  }
}

// A unit's gate and up trellis weights fused for SwiGLU (interleaved by whole 16-row tiles, the
// SwiGLU a separate kernel) against the CPU backend's fusion of the same parts: decode sizes on
// the trellis GEMV, 17 tokens on dequantize + cuBLAS.
TEST(CudaTrellis, FusedGateUpMatchesTheCpuBackend) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int hidden = 80, cols = 256;
  const int block = hadamard_block_for(cols);
  const HadamardRotation rot{hadamard_random_signs(cols, 5), block};
  QWeightHost gate = make_trellis(hidden, cols, 3, block, 41),
              up = make_trellis(hidden, cols, 3, block, 42);
  gate.had = rot;
  up.had = rot;
  const std::vector<TensorView> parts = {qweight_view("model.layers.0.mlp.gate_proj.weight", gate),
                                         qweight_view("model.layers.0.mlp.up_proj.weight", up)};
  auto cpu = make_cpu_backend(2);
  auto gpu = make_cuda_backend(0, BackendOptions{});
  const Tensor wc = cpu->upload_fused(parts, FusedKind::GateUp);
  const Tensor wg = gpu->upload_fused(parts, FusedKind::GateUp);
  for (const int n : {1, 3, 17}) {
    SCOPED_TRACE("n " + std::to_string(n));
    std::mt19937 rng(n + 100);
    const std::vector<float> x = btest::random_f16(size_t(n) * cols, rng);
    const btest::Act xc = btest::upload(*cpu, x, n, cols), xg = btest::upload(*gpu, x, n, cols);
    Tensor yc = cpu->alloc(n, hidden), yg = gpu->alloc(n, hidden);
    cpu->matmul_swiglu(yc, xc.t, wc);
    gpu->matmul_swiglu(yg, xg.t, wg);
    const std::vector<float> want = btest::host(*cpu, yc), got = btest::host(*gpu, yg);
    double err2 = 0, ref2 = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      err2 += (got[i] - want[i]) * (got[i] - want[i]);
      ref2 += want[i] * want[i];
    }
    EXPECT_GT(ref2, 0.0);
    EXPECT_LT(std::sqrt(err2 / ref2), 5e-3);
  }
}

}  // namespace
}  // namespace gyre

#endif  // GYRE_HAVE_CUDA
