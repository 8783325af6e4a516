// The 4-bit decode GEMV (n = 1..8: the stream kernel and the register-fed one) against a float64
// CPU reference built from the host dequantizer (qlinear_ref), for every depth and split-K
// setting (register and shared-memory rings), awkward row / column counts, every group size, sym /
// asym, f32 scales, act-order, and the three epilogues (bias, split outputs, SwiGLU). Skipped
// without a GPU.
#include <gtest/gtest.h>

#ifdef GYRE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <exception>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/qlinear_ref.h"
#include "backend/cuda/qlinear.h"
#include "core/error.h"
#include "core/half.h"
#include "qlinear_test_util.h"

namespace gyre {
namespace {

using namespace qtest;
using Buf = DeviceHalves;

// {kernel (0 auto, 1 register-fed, 4 stream), the stream kernel's shared-memory ring at depth 4
// (-1 default, 0 the register ring, 2 or 4 slots), blocks in flight per warp (stream), split-K,
// the ring's scales (-1 default: staged once per warp; 0 one word per piece in the slot; 1
// staged)}; 0 = auto.
struct Config {
  int kernel, ring, depth, ksplit, staged = -1;
  std::string name() const {
    return std::to_string(kernel) + "/" + std::to_string(ring) + "/" + std::to_string(depth) + "/" +
           std::to_string(ksplit) + "/" + std::to_string(staged);
  }
};
const Config kConfigs[] = {{0, -1, 0, 0},    {1, -1, 0, 0},    {1, -1, 0, 16},   {4, -1, 8, 0},
                           {4, -1, 4, 1},    {4, -1, 16, 16},  {4, -1, 8, 2},    {4, -1, 4, 8},
                           {4, 0, 4, 0},     {4, 0, 4, 8},     {4, 2, 4, 0},     {4, 2, 4, 16},
                           {4, -1, 4, 0, 0}, {4, 2, 4, 16, 0}, {4, -1, 4, 1, 1}, {4, 2, 4, 2, 1}};

void set_config(const Config& c) {
  qlinear_detail::set_stream_staged_scales(c.staged);
  qlinear_detail::set_gemv_smem_ring(c.ring);
  qlinear_detail::set_gemv_kernel(c.kernel);
  qlinear_detail::set_gemv_depth(c.depth);
  qlinear_detail::set_gemv_ksplit(c.ksplit);
}

TEST(CudaGemv4, MatchesFloat64) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Layout layouts[] = {
      {"g128_sym", 128, false, false, DType::F32},  {"g32_asym_perm", 32, true, true, DType::F32},
      {"g64_asym", 64, true, false, DType::F32},    {"g256_sym", 256, false, false, DType::F32},
      {"g64_sym", 64, false, false, DType::F32},    {"gguf_q4_k", 32, true, false, DType::Q4_K},
      {"gguf_q4_0", 32, false, false, DType::Q4_0},
  };
  // Odd tile counts, a partial 64-column block (160 at group 32), a column count that leaves
  // the last split-K warps empty (1280 = 20 blocks), long rows cycling the ring (4096).
  const int shapes[][2] = {{1, 256}, {35, 160}, {300, 1280}, {33, 4096}, {1040, 512}};
  uint32_t seed = 7000;
  for (const Layout& l : layouts) {
    for (const auto& s : shapes) {
      if (s[1] % l.group != 0) continue;
      if (l.gguf != DType::F32 && s[1] % dtype_info(l.gguf).block_elems != 0) continue;
      const QWeightHost w = make_weight(l, s[0], s[1], seed++);
      const int rows = w.desc.rows, cols = w.desc.cols;
      const std::vector<uint16_t> xh = random_halves(size_t(8) * cols, 1.0f, seed++);
      const std::vector<uint16_t> bh = random_halves(rows, 0.5f, seed++);
      const Reference ref = reference(w, xh, &bh, 8);
      QWeightDevice dw = qweight_upload(w);
      Buf x(size_t(8) * cols), y(size_t(8) * rows), bias(rows);
      x.upload(xh);
      bias.upload(bh);
      for (const Config& c : kConfigs) {
        set_config(c);
        for (int n = 1; n <= 8; ++n) {
          SCOPED_TRACE(std::string(l.name) + " " + std::to_string(rows) + "x" +
                       std::to_string(cols) + " n " + std::to_string(n) + " cfg " + c.name());
          y.poison();
          ASSERT_EQ(cudaGetLastError(), cudaSuccess);
          try {
            qlinear_gemv(dw, x.p, y.p, n, bias.p, nullptr);
          } catch (const std::exception& e) {
            FAIL() << e.what();
          }
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          std::vector<uint16_t> got = y.download();
          got.resize(size_t(n) * rows);
          expect_close(got, std::vector<double>(ref.y.begin(), ref.y.begin() + got.size()),
                       std::vector<double>(ref.mag.begin(), ref.mag.begin() + got.size()));
          if (HasFatalFailure()) break;
        }
        if (HasFatalFailure()) break;
      }
      set_config({0, -1, 0, 0});
      qweight_free(dw);
      if (HasFatalFailure()) return;
    }
  }
}

// The ring kernels with their copies landing late: decode-shaped GEMVs launched beside a kernel
// that streams DRAM (test_hooks.h), shared memory poisoned before each, the weight rotating over
// copies that together exceed L2, every launch's output checked. A read of a slot or of the staged
// scales before its cp.async wait passes on an idle GPU, as it did in session 25 (every other
// test here passed with it; the engine's logits were NaN), and should fail here.
TEST(CudaGemv4, MatchesFloat64WhileDramIsBusy) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const size_t hog_bytes = size_t(512) << 20;
  void* hog = nullptr;
  unsigned* sink = nullptr;
  cudaStream_t side = nullptr;
  AtExit release([&] {
    cudaStreamDestroy(side);
    cudaFree(hog);
    cudaFree(sink);
  });
  CUDA_OK(cudaMalloc(&hog, hog_bytes));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&sink), 4));
  CUDA_OK(cudaMemset(hog, 0x5a, hog_bytes));
  CUDA_OK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  const Layout layouts[] = {{"g128_sym", 128, false, false, DType::F32},
                            {"g64_sym", 64, false, false, DType::F32}};
  const int rows = 4096, cols = 4096, copies = 8, launches = 24;  // 8 x 8 MB of weights
  uint32_t seed = 9000;
  for (const Layout& l : layouts) {
    const QWeightHost w = make_weight(l, rows, cols, seed++);
    const std::vector<uint16_t> xh = random_halves(cols, 1.0f, seed++);
    const Reference ref = reference(w, xh, nullptr, 1);
    std::vector<QWeightDevice> dw;
    for (int c = 0; c < copies; ++c) dw.push_back(qweight_upload(w));
    AtExit free_weights([&] {
      for (QWeightDevice& d : dw) qweight_free(d);
      set_config({0, -1, 0, 0});
    });
    Buf x(cols), y(size_t(launches) * rows);
    x.upload(xh);
    for (const Config& c : {Config{0, -1, 0, 0}, Config{4, 2, 4, 0}}) {
      set_config(c);
      SCOPED_TRACE(std::string(l.name) + " cfg " + c.name());
      y.poison();
      try {
        qlinear_detail::launch_memory_hog(hog, hog_bytes, 8, sink, side);
        for (int k = 0; k < launches; ++k) {
          qlinear_detail::poison_shared_memory();
          qlinear_gemv(dw[k % copies], x.p, y.p + size_t(k) * rows, 1, nullptr, nullptr);
        }
      } catch (const std::exception& e) {
        FAIL() << e.what();
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<uint16_t> all = y.download();
      for (int k = 0; k < launches && !HasFailure(); ++k) {
        SCOPED_TRACE("launch " + std::to_string(k));
        expect_close(std::vector<uint16_t>(all.begin() + size_t(k) * rows,
                                           all.begin() + size_t(k + 1) * rows),
                     std::vector<double>(ref.y.begin(), ref.y.begin() + rows),
                     std::vector<double>(ref.mag.begin(), ref.mag.begin() + rows));
      }
      if (HasFailure()) return;
    }
  }
}

// SwiGLU (gate/up interleaved by 8 rows) and the split output (fused QKV) epilogues at n <= 8.
TEST(CudaGemv4, SwigluAndSplitMatchFloat64) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Layout layouts[] = {{"g32_asym_perm", 32, true, true, DType::F32},
                            {"g128_sym", 128, false, false, DType::F32}};
  const int hidden = 157, rows = 2 * 160, cols = 1024;  // 20 tiles, a padded hidden block
  uint32_t seed = 8000;
  for (const Layout& l : layouts) {
    const QWeightHost w = make_weight(l, rows, cols, seed++);
    const std::vector<uint16_t> xh = random_halves(size_t(8) * cols, 1.0f, seed++);
    const Reference ref = reference(w, xh, nullptr, 8);
    QWeightDevice dw = qweight_upload(w);
    Buf x(size_t(8) * cols), out(size_t(8) * rows);
    x.upload(xh);
    for (const Config& c : kConfigs) {
      set_config(c);
      for (const int n : {1, 2, 5, 8}) {
        SCOPED_TRACE(std::string(l.name) + " n " + std::to_string(n) + " cfg " + c.name());
        out.poison();
        ASSERT_EQ(cudaGetLastError(), cudaSuccess);
        try {
          ASSERT_TRUE(qlinear_gemv_swiglu(dw, x.p, out.p, n, hidden, nullptr));
        } catch (const std::exception& e) {
          FAIL() << e.what();
        }
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<uint16_t> got = out.download();
        got.resize(size_t(n) * hidden);
        std::vector<double> want(got.size()), mag(got.size());
        for (int t = 0; t < n; ++t) {
          for (int h = 0; h < hidden; ++h) {
            const size_t gi = size_t(t) * rows + 16 * (h / 8) + h % 8, ui = gi + 8;
            const double gate = ref.y[gi], up = ref.y[ui], silu = gate / (1.0 + std::exp(-gate));
            want[size_t(t) * hidden + h] = silu * up;
            mag[size_t(t) * hidden + h] =
                std::fabs(silu) * ref.mag[ui] + ref.mag[gi] * std::fabs(up);
          }
        }
        expect_close(got, want, mag);

        // Three outputs of 100, 13 and 207 rows.
        const int ends[3] = {100, 113, rows};
        Buf parts[3] = {Buf(size_t(n) * 100), Buf(size_t(n) * 13), Buf(size_t(n) * 207)};
        cuda::OutSplit split;
        for (int i = 0; i < 3; ++i) {
          parts[i].poison();
          split.out[i] = parts[i].p;
          split.end[i] = ends[i];
        }
        split.parts = 3;
        try {
          qlinear_matmul_split(dw, x.p, split, n, nullptr, nullptr);
        } catch (const std::exception& e) {
          FAIL() << e.what();
        }
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<uint16_t> joined(size_t(n) * rows);
        int start = 0;
        for (int i = 0; i < 3; ++i) {
          const std::vector<uint16_t> h = parts[i].download();
          const int width = ends[i] - start;
          for (int t = 0; t < n; ++t)
            for (int r = 0; r < width; ++r)
              joined[size_t(t) * rows + start + r] = h[size_t(t) * width + r];
          start = ends[i];
        }
        expect_close(joined, std::vector<double>(ref.y.begin(), ref.y.begin() + joined.size()),
                     std::vector<double>(ref.mag.begin(), ref.mag.begin() + joined.size()));
        if (HasFatalFailure()) break;
      }
      if (HasFatalFailure()) break;
    }
    set_config({0, -1, 0, 0});
    qweight_free(dw);
  }
}

// The decode fusions (qlinear.h QlinearFusion): x RMS-normalised per token (the reference
// normalises on the host in float and rounds to FP16, as the rmsnorm kernel does) and y += x W.
TEST(CudaGemv4, FusedNormAndAccumulateMatchFloat64) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Layout layouts[] = {{"g128_sym", 128, false, false, DType::F32},
                            {"g32_asym_perm", 32, true, true, DType::F32},
                            {"g64_asym", 64, true, false, DType::F32}};
  // 8448 columns: more 8-column chunks per thread than the norm weights loaded ahead (two).
  const int shapes[][2] = {{35, 160}, {300, 1280}, {33, 4096}, {20, 8448}};
  const float eps = 1e-5f;
  uint32_t seed = 9000;
  for (const Layout& l : layouts) {
    for (const auto& s : shapes) {
      if (s[1] % l.group != 0) continue;
      const QWeightHost w = make_weight(l, s[0], s[1], seed++);
      const int rows = w.desc.rows, cols = w.desc.cols;
      const std::vector<uint16_t> xh = random_halves(size_t(8) * cols, 3.0f, seed++);
      const std::vector<uint16_t> nh = random_halves(cols, 1.5f, seed++);
      const std::vector<uint16_t> y0 = random_halves(size_t(8) * rows, 2.0f, seed++);
      const std::vector<uint16_t> xn = qtest::rms_normed(xh, nh, 8, cols, eps);
      const Reference plain = reference(w, xh, nullptr, 8), normed = reference(w, xn, nullptr, 8);
      QWeightDevice dw = qweight_upload(w);
      Buf x(size_t(8) * cols), y(size_t(8) * rows), norm(cols);
      x.upload(xh);
      norm.upload(nh);
      for (const Config& c :
           {Config{0, -1, 0, 0}, Config{4, -1, 4, 2}, Config{4, 0, 4, 2}, Config{1, -1, 0, 0}}) {
        set_config(c);
        for (int n = 1; n <= 8; ++n) {
          // The norm folds in where the stream GEMV is the default (n <= 2); beyond, asking
          // for it is an error and only the accumulation runs.
          const bool norm_ok = qlinear_fuses_norm(dw, n);
          ASSERT_EQ(norm_ok, n <= 2);
          if (!norm_ok) {
            QlinearFusion f;
            f.norm_w = norm.p;
            EXPECT_THROW(qlinear_matmul(dw, x.p, y.p, n, nullptr, nullptr, f), Error);
          }
          for (int mode = norm_ok ? 0 : 1; mode < (norm_ok ? 3 : 2); ++mode) {
            SCOPED_TRACE(std::string(l.name) + " " + std::to_string(rows) + "x" +
                         std::to_string(cols) + " n " + std::to_string(n) + " mode " +
                         std::to_string(mode) + " cfg " + c.name());
            QlinearFusion f;
            f.accumulate = mode != 0;
            if (mode != 1) {
              f.norm_w = norm.p;
              f.norm_eps = eps;
            }
            const Reference& ref = mode == 1 ? plain : normed;
            if (f.accumulate) {
              y.upload(y0);
            } else {
              y.poison();
            }
            try {
              qlinear_matmul(dw, x.p, y.p, n, nullptr, nullptr, f);
            } catch (const std::exception& e) {
              FAIL() << e.what();
            }
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            std::vector<uint16_t> got = y.download();
            got.resize(size_t(n) * rows);
            std::vector<double> want(ref.y.begin(), ref.y.begin() + got.size()),
                mag(ref.mag.begin(), ref.mag.begin() + got.size());
            if (f.accumulate) {
              for (size_t i = 0; i < want.size(); ++i) {
                want[i] += f16_to_f32(y0[i]);
                mag[i] += std::fabs(f16_to_f32(y0[i]));
              }
            }
            expect_close(got, want, mag);
            if (HasFatalFailure()) break;
          }
          if (HasFatalFailure()) break;
        }
        if (HasFatalFailure()) break;
      }
      set_config({0, -1, 0, 0});
      qweight_free(dw);
      if (HasFatalFailure()) return;
    }
  }
}

}  // namespace
}  // namespace gyre

#else
TEST(CudaGemv4, NotBuilt) {
  GTEST_SKIP() << "built without CUDA";
}
#endif
