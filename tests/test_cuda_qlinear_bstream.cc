// The stream batch kernel (qlinear_batch_stream.cu, forced with set_batch_kernel(5)) against a
// float64 CPU reference built from the host dequantizer: 4-bit layouts (groups 32/64/128, sym and
// asym, f16 and f32 scales, act-order), awkward row and column counts, n = 9..64, single and
// split K-chunks (the workspace reduction), and every epilogue. Skipped without a GPU.
#include <gtest/gtest.h>

#ifdef GYRE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/qlinear_ref.h"
#include "backend/cuda/qlinear.h"
#include "core/half.h"

namespace gyre {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

struct DeviceHalves {
  __half* p = nullptr;
  size_t n = 0;
  explicit DeviceHalves(size_t count) : n(count) {
    if (cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(count, 1) * 2) != cudaSuccess)
      p = nullptr;
  }
  ~DeviceHalves() { cudaFree(p); }
  void upload(const std::vector<uint16_t>& h) {
    cudaMemcpy(p, h.data(), h.size() * 2, cudaMemcpyHostToDevice);
  }
  std::vector<uint16_t> download(size_t count) const {
    std::vector<uint16_t> h(count);
    cudaMemcpy(h.data(), p, count * 2, cudaMemcpyDeviceToHost);
    return h;
  }
  void poison() { cudaMemset(p, 0xff, n * 2); }  // 0xffff is a NaN in FP16
};

std::vector<uint16_t> random_halves(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<uint16_t> h(n);
  for (auto& v : h) v = f32_to_f16(u(rng));
  return h;
}

struct Layout {
  std::string name;
  int group;
  bool asym, perm;
  DType gguf;  // F32: round-to-nearest from floats
};

QWeightHost make_weight(const Layout& l, int rows, int cols, uint32_t seed) {
  std::mt19937 rng(seed);
  if (l.gguf != DType::F32) {
    // Random GGUF blocks with small finite f16 scale (and min) fields.
    const DTypeInfo& info = dtype_info(l.gguf);
    const size_t blocks = size_t(rows) * cols / info.block_elems;
    std::vector<uint8_t> b(blocks * info.block_bytes);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    std::uniform_real_distribution<float> scale(-0.002f, 0.002f);
    for (size_t i = 0; i < blocks; ++i) {
      const uint16_t d = f32_to_f16(scale(rng)), m = f32_to_f16(scale(rng));
      std::memcpy(b.data() + i * info.block_bytes, &d, 2);
      if (l.gguf == DType::Q4_K) std::memcpy(b.data() + i * info.block_bytes + 2, &m, 2);
    }
    return qweight_pack_from_gguf(l.gguf, b.data(), rows, cols);
  }
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  std::vector<float> w(size_t(rows) * cols);
  for (float& v : w) v = u(rng);
  std::vector<int32_t> perm(cols);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  return qweight_pack_from_f32(w.data(), rows, cols, 4, l.group, l.asym,
                               l.perm ? perm.data() : nullptr);
}

// float64 x W^T (+ bias) [n, rows] and the sums of |products| (the FP16 error scale).
struct Reference {
  std::vector<double> y, mag;
};
Reference reference(const QWeightHost& w, const std::vector<uint16_t>& xh,
                    const std::vector<uint16_t>* bias, int n) {
  const int rows = w.desc.rows, cols = w.desc.cols;
  Reference r;
  r.y.assign(size_t(n) * rows, 0.0);
  r.mag.assign(r.y.size(), 0.0);
  std::vector<float> wrow(cols);
  for (int row = 0; row < rows; ++row) {
    qweight_dequantize_row(w, row, wrow.data());
    for (int t = 0; t < n; ++t) {
      double acc = bias ? f16_to_f32((*bias)[row]) : 0.0, mag = std::fabs(acc);
      for (int c = 0; c < cols; ++c) {
        const double p = double(f16_to_f32(xh[size_t(t) * cols + c])) * wrow[c];
        acc += p;
        mag += std::fabs(p);
      }
      r.y[size_t(t) * rows + row] = acc;
      r.mag[size_t(t) * rows + row] = mag;
    }
  }
  return r;
}

void expect_close(const std::vector<uint16_t>& got, const std::vector<double>& ref,
                  const std::vector<double>& mag) {
  ASSERT_EQ(got.size(), ref.size());
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = f16_to_f32(got[i]);
    ASSERT_FALSE(std::isnan(g)) << "unwritten element " << i;
    ASSERT_NEAR(g, ref[i], 4e-3 * mag[i] + 1e-3 * std::fabs(ref[i]) + 1e-6) << "element " << i;
    err2 += (g - ref[i]) * (g - ref[i]);
    ref2 += ref[i] * ref[i];
  }
  if (ref.size() >= 64) {
    EXPECT_LT(std::sqrt(err2 / ref2), 2e-3);
  }
}

void force(const int (&cfg)[4]) {
  qlinear_detail::set_batch_kernel(5);
  qlinear_detail::set_batch_stream_config(cfg[0], cfg[1], cfg[2], cfg[3]);
}
void unforce() {
  qlinear_detail::set_batch_kernel(0);
  qlinear_detail::set_batch_stream_config(0, 0, 0, -1);
}
std::string name(const int (&cfg)[4]) {
  return " cfg " + std::to_string(cfg[0]) + "/" + std::to_string(cfg[1]) + "/" +
         std::to_string(cfg[2]) + "/" + std::to_string(cfg[3]);
}

const Layout kLayouts[] = {
    {"g128_sym", 128, false, false, DType::F32},  {"g64_asym", 64, true, false, DType::F32},
    {"g32_sym", 32, false, false, DType::F32},    {"g32_asym_perm", 32, true, true, DType::F32},
    {"gguf_q4_0", 32, false, false, DType::Q4_0}, {"gguf_q4_k_f32", 32, true, false, DType::Q4_K},
};
// {tiles per warp, K-chunks, warps per block, partition}; 0 = automatic (chunks and blocks:
// raised to what fits shared memory); partition -1 = automatic, -2 = the K-chunk grid, >= 0 =
// stream-K blocks (0 = one per SM). 13 blocks over 3 tile groups give ranges that span two groups.
const int kConfigs[][4] = {{0, 0, 0, -1}, {1, 0, 8, -2}, {2, 1, 16, -2}, {1, 3, 16, -2},
                           {2, 8, 8, -2}, {1, 0, 16, 0}, {2, 0, 8, 0},   {2, 0, 16, 5},
                           {1, 0, 8, 13}, {2, 0, 16, 1}};

// Plain output with bias (qlinear_batch): rows that leave partial 16-row tiles and partial tile
// groups, a half 64-column block (160 columns), chunks that do not divide the column blocks.
TEST(CudaQlinearBStream, MatchesFloat64) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int shapes[][2] = {{17, 1280}, {300, 768}, {45, 2560}, {200, 160}, {130, 4352}};
  const int ns[] = {9, 13, 17, 32, 40, 64};
  constexpr int kMaxN = 64;
  uint32_t seed = 7000;
  for (const Layout& l : kLayouts) {
    for (const auto& s : shapes) {
      if (s[1] % 256 != 0 && (l.group != 32 || l.gguf == DType::Q4_K)) continue;
      const QWeightHost w = make_weight(l, s[0], s[1], seed++);
      const int rows = w.desc.rows, cols = w.desc.cols;
      const std::vector<uint16_t> xh = random_halves(size_t(kMaxN) * cols, 1.0f, seed++);
      const std::vector<uint16_t> bh = random_halves(rows, 0.5f, seed++);
      const Reference ref = reference(w, xh, &bh, kMaxN);
      QWeightDevice dw = qweight_upload(w);
      DeviceHalves x(size_t(kMaxN) * cols), y(size_t(kMaxN) * rows), bias(rows);
      x.upload(xh);
      bias.upload(bh);
      for (const auto& cfg : kConfigs) {
        force(cfg);
        for (const int n : ns) {
          SCOPED_TRACE(l.name + " rows " + std::to_string(rows) + " cols " + std::to_string(cols) +
                       " n " + std::to_string(n) + name(cfg));
          y.poison();
          qlinear_batch(dw, x.p, y.p, n, bias.p, nullptr);
          CUDA_OK(cudaDeviceSynchronize());
          const size_t count = size_t(n) * rows;
          expect_close(y.download(count), {ref.y.begin(), ref.y.begin() + count},
                       {ref.mag.begin(), ref.mag.begin() + count});
          if (HasFatalFailure()) break;
        }
      }
      unforce();
      qweight_free(dw);
      if (HasFatalFailure()) return;
    }
  }
}

// The automatic dispatch (qlinear_matmul, kernel 0) on a weight large enough for it to pick the
// stream kernel (>= 128 tiles; at 33..64 tokens up to 384), with the knobs at their defaults.
TEST(CudaQlinearBStream, DispatchMatchesFloat64) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Layout layouts[] = {kLayouts[0], kLayouts[5]};
  constexpr int kMaxN = 64, rows = 2056, cols = 1024;
  uint32_t seed = 7300;
  unforce();
  for (const Layout& l : layouts) {
    const QWeightHost w = make_weight(l, rows, cols, seed++);
    const std::vector<uint16_t> xh = random_halves(size_t(kMaxN) * cols, 1.0f, seed++);
    const std::vector<uint16_t> bh = random_halves(rows, 0.5f, seed++);
    const Reference ref = reference(w, xh, &bh, kMaxN);
    QWeightDevice dw = qweight_upload(w);
    DeviceHalves x(size_t(kMaxN) * cols), y(size_t(kMaxN) * rows), bias(rows);
    x.upload(xh);
    bias.upload(bh);
    for (const int n : {9, 16, 32, 40, 64}) {
      SCOPED_TRACE(l.name + " n " + std::to_string(n));
      y.poison();
      qlinear_matmul(dw, x.p, y.p, n, bias.p, nullptr);
      CUDA_OK(cudaDeviceSynchronize());
      const size_t count = size_t(n) * rows;
      expect_close(y.download(count), {ref.y.begin(), ref.y.begin() + count},
                   {ref.mag.begin(), ref.mag.begin() + count});
      if (HasFatalFailure()) break;
    }
    qweight_free(dw);
    if (HasFatalFailure()) return;
  }
}

// SwiGLU (gate/up interleaved by 8 rows), three split outputs, and the residual add.
TEST(CudaQlinearBStream, EpiloguesMatchFloat64) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int hidden = 37, rows = 2 * 40, cols = 1536, n_max = 64;
  uint32_t seed = 7500;
  for (const Layout& l : kLayouts) {
    const QWeightHost w = make_weight(l, rows, cols, seed++);
    const std::vector<uint16_t> xh = random_halves(size_t(n_max) * cols, 1.0f, seed++);
    const Reference ref = reference(w, xh, nullptr, n_max);
    const std::vector<uint16_t> y0 = random_halves(size_t(n_max) * rows, 2.0f, seed++);
    QWeightDevice dw = qweight_upload(w);
    DeviceHalves x(size_t(n_max) * cols), out(size_t(n_max) * rows);
    x.upload(xh);
    for (const auto& cfg : kConfigs) {
      force(cfg);
      for (const int n : {9, 20, 33, 64}) {
        SCOPED_TRACE(l.name + " n " + std::to_string(n) + name(cfg));
        out.poison();
        ASSERT_TRUE(qlinear_gemv_swiglu(dw, x.p, out.p, n, hidden, nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<double> sw(size_t(n) * hidden), sm(sw.size());
        for (int t = 0; t < n; ++t) {
          for (int h = 0; h < hidden; ++h) {
            // Rows [16b, 16b + 8) are gate rows 8b.., the next 8 the matching up rows.
            const size_t gi = size_t(t) * rows + 16 * (h / 8) + h % 8, ui = gi + 8;
            const double gate = ref.y[gi], up = ref.y[ui];
            const double silu = gate / (1.0 + std::exp(-gate));
            sw[size_t(t) * hidden + h] = silu * up;
            sm[size_t(t) * hidden + h] =
                std::fabs(silu) * ref.mag[ui] + ref.mag[gi] * std::fabs(up);
          }
        }
        expect_close(out.download(sw.size()), sw, sm);

        DeviceHalves a(size_t(n) * 30), b(size_t(n) * 7), c(size_t(n) * 43);
        a.poison();
        b.poison();
        c.poison();
        cuda::OutSplit split;
        split.out[0] = a.p;
        split.out[1] = b.p;
        split.out[2] = c.p;
        split.end[0] = 30;
        split.end[1] = 37;
        split.end[2] = rows;
        split.parts = 3;
        qlinear_matmul_split(dw, x.p, split, n, nullptr, nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        const std::vector<uint16_t> parts[3] = {
            a.download(size_t(n) * 30), b.download(size_t(n) * 7), c.download(size_t(n) * 43)};
        std::vector<uint16_t> joined(size_t(n) * rows);
        int start = 0;
        for (int pi = 0; pi < 3; ++pi) {
          const int width = split.end[pi] - start;
          for (int t = 0; t < n; ++t)
            for (int r = 0; r < width; ++r)
              joined[size_t(t) * rows + start + r] = parts[pi][size_t(t) * width + r];
          start = split.end[pi];
        }
        const size_t count = size_t(n) * rows;
        expect_close(joined, {ref.y.begin(), ref.y.begin() + count},
                     {ref.mag.begin(), ref.mag.begin() + count});

        // y += x . W: the product is rounded to FP16 before the add, as a separate add would be.
        std::vector<uint16_t> start_y(y0.begin(), y0.begin() + count);
        out.upload(start_y);
        QlinearFusion f;
        f.accumulate = true;
        qlinear_matmul(dw, x.p, out.p, n, nullptr, nullptr, f);
        CUDA_OK(cudaDeviceSynchronize());
        std::vector<double> acc(count), am(count);
        for (size_t i = 0; i < count; ++i) {
          acc[i] = ref.y[i] + f16_to_f32(start_y[i]);
          am[i] = ref.mag[i] + std::fabs(f16_to_f32(start_y[i]));
        }
        expect_close(out.download(count), acc, am);
        if (HasFatalFailure()) break;
      }
    }
    unforce();
    qweight_free(dw);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace gyre

#else
TEST(CudaQlinearBStream, NotBuilt) {
  GTEST_SKIP() << "built without CUDA";
}
#endif
