// 2/3/5/6/8-bit quantized weights on the GPU against the CPU reference dequantizer (qlinear_ref) in
// float64: GEMV at every n through qlinear_matmul (awkward row and column counts, short tiles), the
// serving-batch kernel beyond 8 tokens, split outputs, and the FP16 dequantization, in the tiled
// layout with the stream GEMV
// (qlinear_bits_stream.cu, the default) and in the host layout (qlinear_bits.cu,
// set_bits_stream(0)); the stream GEMV's fusions (RMSNorm, y +=, SwiGLU); the 2/3/5/6-bit in-place
// arrangement (qlinear_inplace.h) and the split planes' one (set_bits_decode). Skipped without a
// GPU (the layout's host tests: test_cuda_qbits_layout.cc).
#include <gtest/gtest.h>

#ifdef GYRE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/qlinear_ref.h"
#include "backend/cuda/out_split.h"
#include "backend/cuda/qlinear.h"
#include "core/error.h"
#include "core/half.h"
#include "qlinear_test_util.h"

namespace gyre {
namespace {

using qtest::random_halves;
using Halves = qtest::DeviceHalves;

QWeightHost make_weight(int bits, int group, bool asym, bool perm, int rows, int cols,
                        uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.03f);
  std::vector<float> w(static_cast<size_t>(rows) * cols);
  for (float& x : w) x = nd(rng);
  std::vector<int32_t> p(cols);
  std::iota(p.begin(), p.end(), 0);
  std::shuffle(p.begin(), p.end(), rng);
  return qweight_pack_from_f32(w.data(), rows, cols, bits, group, asym, perm ? p.data() : nullptr);
}

std::vector<double> dequantized(const QWeightHost& w) {
  std::vector<float> row(w.desc.cols);
  std::vector<double> out;
  for (int r = 0; r < w.desc.rows; ++r) {
    qweight_dequantize_row(w, r, row.data());
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

// y from the GPU (n tokens, all rows) against float64 x W^T + bias.
// wf_cache: dequantized(w) when the caller has it.
void expect_close(const QWeightHost& w, const std::vector<uint16_t>& xh,
                  const std::vector<uint16_t>& bh, const std::vector<uint16_t>& yh, int n,
                  const std::vector<double>* wf_cache = nullptr) {
  const int rows = w.desc.rows, cols = w.desc.cols;
  const std::vector<double> wf = wf_cache != nullptr ? *wf_cache : dequantized(w);
  for (int t = 0; t < n; ++t)
    for (int r = 0; r < rows; ++r) {
      double ref = bh.empty() ? 0.0 : f16_to_f32(bh[r]), mag = std::fabs(ref);
      for (int c = 0; c < cols; ++c) {
        const double p = f16_to_f32(xh[size_t(t) * cols + c]) * wf[size_t(r) * cols + c];
        ref += p;
        mag += std::fabs(p);
      }
      const double got = f16_to_f32(yh[size_t(t) * rows + r]);
      ASSERT_FALSE(std::isnan(got)) << "unwritten y[" << t << ", " << r << "]";
      ASSERT_NEAR(got, ref, 4e-3 * mag + 1e-3 * std::fabs(ref) + 1e-6)
          << w.desc.bits << "b y[" << t << ", " << r << "] n " << n;
    }
}

// The FP16 dequantization of dw (the prefill path; it frees dw) against the reference's values
// ref: each within one FP16 rounding (the GPU rounds s*q+m once).
void expect_dequantized(QWeightDevice& dw, const std::vector<double>& ref,
                        const std::string& what) {
  Halves out(ref.size());
  out.poison();
  qlinear_dequantize(dw, out.p, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = out.download();
  qweight_free(dw);
  for (size_t i = 0; i < ref.size(); ++i)
    ASSERT_NEAR(f16_to_f32(got[i]), ref[i], std::fabs(ref[i]) * 0x1p-10 + 1e-7)
        << what << " dequantized at " << i;
}

// qlinear_matmul of the uploaded dw (w's) on random x and bias (seeds seed, seed + 1) against
// float64. ref: dequantized(w) when the caller has it.
void check_uploaded(const QWeightHost& w, const QWeightDevice& dw, int n, uint32_t seed,
                    const std::vector<double>* ref = nullptr) {
  const int rows = w.desc.rows, cols = w.desc.cols;
  const std::vector<uint16_t> xh = random_halves(size_t(n) * cols, 1.0f, seed);
  const std::vector<uint16_t> bh = random_halves(rows, 0.5f, seed + 1);
  Halves x(size_t(n) * cols), y(size_t(n) * rows), b(rows);
  x.upload(xh);
  b.upload(bh);
  y.poison();
  qlinear_matmul(dw, x.p, y.p, n, b.p, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  expect_close(w, xh, bh, y.download(), n, ref);
}

void check_matmul(const QWeightHost& w, int n, uint32_t seed) {
  QWeightDevice dw = qweight_upload(w);
  check_uploaded(w, dw, n, seed);
  qweight_free(dw);
}

// The tiled 8-bit layout (opt-in, set_bits8_stream) for weights uploaded while it lives.
struct Tiled8 {
  Tiled8() { qlinear_detail::set_bits8_stream(1); }
  ~Tiled8() { qlinear_detail::set_bits8_stream(-1); }
  Tiled8(const Tiled8&) = delete;
  Tiled8& operator=(const Tiled8&) = delete;
};

struct Narrow {
  int bits, group;
  bool asym, perm;
};

// 8 bits: tiled in place (qlinear_bits_stream.cu) where a test holds a Tiled8, the host layout
// with set_bits_stream(0).
const Narrow kLayouts[] = {{2, 32, false, false}, {2, 128, true, false},  {3, 64, false, false},
                           {3, 32, true, true},   {5, 128, false, false}, {5, 64, true, false},
                           {6, 32, false, true},  {6, 128, true, false},  {8, 32, false, false},
                           {8, 64, true, true},   {8, 128, false, true}};

// The 2/3/5/6-bit decodes, in-place (the default) and the split planes' (set_bits_decode(0)), at
// every group size, symmetric and not, with and without act-order, every piece size (block
// counts padded; 8 at 2 bits only), n = 1, 2, 8 (3 bits: both register ring depths; the
// shared-memory ring on and off), and the FP16 dequantization of each.
TEST(CudaQbits, OldAndNewDecodeMatchFloat64) {
  if (!qtest::have_gpu()) GTEST_SKIP() << "no CUDA device";
  qlinear_detail::set_bits_batch(0);  // the stream GEMV at n = 8 too (reset by the scope guard)
  const qtest::AtExit reset([] { qlinear_detail::set_bits_batch(-1); });
  uint32_t seed = 2000;
  for (const int decode : {1, 0})
    for (const int bits : {2, 3, 5, 6})
      for (const int group : {32, 64, 128})
        for (const bool asym : {false, true}) {
          const bool perm = (group == 64) != asym;
          const QWeightHost w = make_weight(bits, group, asym, perm, 77, 1152, seed++);
          const std::vector<double> ref = dequantized(w);
          for (const int pieces : {0, 1, 2, 4, 8}) {
            if (pieces == 8 && bits != 2) continue;  // 4 blocks per piece there
            SCOPED_TRACE(std::to_string(bits) + "b g" + std::to_string(group) +
                         (asym ? " asym" : " sym") + (perm ? " perm" : "") + " decode " +
                         std::to_string(decode) + " pieces " + std::to_string(pieces));
            qlinear_detail::set_bits_decode(decode);
            qlinear_detail::set_bits_stream_pieces(pieces);
            QWeightDevice dw = qweight_upload(w);
            qlinear_detail::set_bits_stream_pieces(0);
            qlinear_detail::set_bits_decode(-1);
            ASSERT_GT(dw.narrow_tiled, 0);
            ASSERT_EQ(dw.narrow_inplace, decode == 1);
            // The defaults; 3 bits, 2 blocks per piece: the register ring of 4 (in-place only);
            // the shared-memory ring on at every width (in-place, 1 or 2 blocks per piece), off,
            // on with one scale word per piece in its slot instead of staged scales.
            for (const int mode : {0, 1, 2, 3, 4})
              for (const int n : {1, 2, 8}) {
                if (mode == 1 && (bits != 3 || decode != 1)) continue;
                if (mode >= 2 && (decode != 1 || asym || pieces > 2)) continue;
                qlinear_detail::set_bits_stream_depth(mode == 1 ? 4 : 0);
                qlinear_detail::set_bits_smem_ring(mode == 2 || mode == 4 ? 4 : mode == 3 ? 0 : -1);
                qlinear_detail::set_stream_staged_scales(mode == 4 ? 0 : -1);
                check_uploaded(w, dw, n, seed, &ref);
                seed += 2;
                qlinear_detail::set_bits_stream_depth(0);
                qlinear_detail::set_bits_smem_ring(-1);
                qlinear_detail::set_stream_staged_scales(-1);
                if (HasFatalFailure()) break;
              }
            if (HasFatalFailure()) {
              qweight_free(dw);
              return;
            }
            expect_dequantized(dw, ref, "");
            if (HasFatalFailure()) return;
          }
        }
}

// 8-bit weights in the tiled layout (one plane of bytes, decoded in place by a PRMT): every group
// size, symmetric and not, with and without act-order, at n = 1..4 and 8 on the stream GEMV with
// the shared-memory ring (staged scales, and one scale word per piece) and the register ring, at
// 9 and 40 tokens on the serving-batch kernel, the FP16 dequantization; and
// GYRE_CUDA_BITS8_STREAM=0 (set_bits8_stream(0)): the host layout and its kernels, which the
// tiled weight's results match to the same tolerance.
TEST(CudaQbits, EightBitTiledMatchesFloat64) {
  if (!qtest::have_gpu()) GTEST_SKIP() << "no CUDA device";
  qlinear_detail::set_bits_batch(0);  // the stream GEMV at n = 8 too (reset by the scope guard)
  const qtest::AtExit reset([] {
    qlinear_detail::set_bits_batch(-1);
    qlinear_detail::set_bits_smem_ring(-1);
    qlinear_detail::set_stream_staged_scales(-1);
    qlinear_detail::set_bits8_stream(-1);
  });
  uint32_t seed = 4000;
  const int shapes[][2] = {{77, 1152}, {301, 2560}};
  for (const int group : {32, 64, 128})
    for (const bool asym : {false, true})
      for (const auto& sh : shapes) {
        const bool perm = (group == 64) != asym;
        const QWeightHost w = make_weight(8, group, asym, perm, sh[0], sh[1], seed++);
        const std::vector<double> ref = dequantized(w);
        for (const int tiled : {1, 0}) {
          qlinear_detail::set_bits8_stream(tiled);
          QWeightDevice dw = qweight_upload(w);
          qlinear_detail::set_bits8_stream(-1);
          ASSERT_EQ(dw.narrow_tiled, tiled);
          ASSERT_EQ(dw.narrow_inplace, tiled == 1);
          // the defaults; the register ring; one scale word per piece in its slot
          for (const int mode : {0, 1, 2})
            for (const int n : {1, 2, 3, 4, 8, 9, 40}) {
              if (mode > 0 && (tiled == 0 || n > 8 || (mode == 2 && asym))) continue;
              SCOPED_TRACE("8b g" + std::to_string(group) + (asym ? " asym" : " sym") +
                           (perm ? " perm" : "") + " rows " + std::to_string(sh[0]) + " tiled " +
                           std::to_string(tiled) + " mode " + std::to_string(mode) + " n " +
                           std::to_string(n));
              qlinear_detail::set_bits_batch(n > 8 ? -1 : 0);
              qlinear_detail::set_bits_smem_ring(mode == 1 ? 0 : -1);
              qlinear_detail::set_stream_staged_scales(mode == 2 ? 0 : -1);
              ASSERT_TRUE(qlinear_runs_direct(dw, n));
              check_uploaded(w, dw, n, seed, &ref);
              seed += 2;
              qlinear_detail::set_bits_smem_ring(-1);
              qlinear_detail::set_stream_staged_scales(-1);
              if (HasFatalFailure()) {
                qweight_free(dw);
                return;
              }
            }
          expect_dequantized(dw, ref, "8b tiled " + std::to_string(tiled));
          if (HasFatalFailure()) return;
        }
      }
}

// Rows not multiples of 2/16/64; 96 columns (one short tile of 3 units), 1056 (a full tile and a
// short one of 1 unit), 2560 (2.5 tiles, split-K across warps).
TEST(CudaQbits, MatmulMatchesFloat64AtEveryN) {
  if (!qtest::have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Tiled8 tiled8;
  const int shapes[][2] = {{1, 96}, {77, 1056}, {301, 2560}};
  uint32_t seed = 1;
  for (const Narrow& l : kLayouts)
    for (const auto& s : shapes) {
      if (s[1] % l.group != 0) continue;
      const QWeightHost w = make_weight(l.bits, l.group, l.asym, l.perm, s[0], s[1], seed++);
      for (const int n : {1, 3, 8, 9, 33}) {
        SCOPED_TRACE(std::to_string(l.bits) + "b g" + std::to_string(l.group) + " rows " +
                     std::to_string(s[0]) + " cols " + std::to_string(s[1]) + " n " +
                     std::to_string(n));
        check_matmul(w, n, seed++);
      }
    }
}

// The serving-batch kernel (qlinear_batch_stream.cu) on tiled narrow weights beyond 8 tokens:
// every width, group and symmetry at its default pieces (padded block counts: 1152 columns are 18
// blocks), act-order in some, token counts that fill 2, 4 and 8-token tiles partly and wholly and
// take two passes (65, 128), and 2 and 5 tokens with the kernel taking over from 2 rows, on the
// automatic plan, the K-chunk grid and a stream-K of 3 blocks (ranges that split tile groups); then
// the GEMV per 8 tokens where the pieces are not the default (no batch instantiation) and with the
// kernel switched off.
TEST(CudaQbits, BatchKernelMatchesFloat64) {
  if (!qtest::have_gpu()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 3000;
  const int shapes[][2] = {{77, 1152}, {301, 2560}};
  for (const int bits : {2, 3, 5, 6})
    for (const int group : {32, 64, 128})
      for (const bool asym : {false, true})
        for (const auto& sh : shapes) {
          const bool perm = (group == 64) != asym;
          const QWeightHost w = make_weight(bits, group, asym, perm, sh[0], sh[1], seed++);
          const std::vector<double> ref = dequantized(w);
          QWeightDevice dw = qweight_upload(w);
          for (const int plan : {-1, -2, 3})
            for (const int n : {2, 5, 9, 16, 17, 40, 64, 65, 128}) {
              if (plan != -1 && n != 17 && n != 40) continue;
              qlinear_detail::set_bits_batch(n < 5 ? 2 : -1);  // from 2 rows: n = 2 too
              SCOPED_TRACE(std::to_string(bits) + "b g" + std::to_string(group) +
                           (asym ? " asym" : " sym") + (perm ? " perm" : "") + " rows " +
                           std::to_string(sh[0]) + " n " + std::to_string(n) + " plan " +
                           std::to_string(plan));
              ASSERT_TRUE(qlinear_runs_direct(dw, n));
              qlinear_detail::set_batch_stream_config(0, 0, 0, plan);
              check_uploaded(w, dw, n, seed, &ref);
              seed += 2;
              qlinear_detail::set_batch_stream_config(0, 0, 0, -1);
              qlinear_detail::set_bits_batch(-1);
              if (HasFatalFailure()) {
                qweight_free(dw);
                return;
              }
            }
          qweight_free(dw);
        }
  // Not the default pieces (2 blocks at 3 bits), or switched off: not direct (the backend
  // dequantizes); qlinear_matmul still right through the GEMV per 8 tokens.
  const QWeightHost w = make_weight(3, 64, false, false, 77, 1152, seed++);
  const std::vector<double> ref = dequantized(w);
  for (const int mode : {0, 1}) {
    qlinear_detail::set_bits_stream_pieces(mode == 0 ? 0 : 2);
    qlinear_detail::set_bits_batch(mode == 0 ? 0 : -1);  // 0: never
    QWeightDevice dw = qweight_upload(w);
    qlinear_detail::set_bits_stream_pieces(0);
    EXPECT_FALSE(qlinear_runs_direct(dw, 9));
    check_uploaded(w, dw, 20, seed, &ref);
    seed += 2;
    qlinear_detail::set_bits_batch(-1);
    qweight_free(dw);
  }
  // An odd count of column blocks at 2 and 3 bits (one-block pieces go two to a unit of the batch
  // kernel): not direct, and right.
  for (const int bits : {2, 3}) {
    const QWeightHost wo = make_weight(bits, 64, false, false, 77, 64 * 17, seed++);
    const std::vector<double> ref_o = dequantized(wo);
    QWeightDevice dw = qweight_upload(wo);
    EXPECT_FALSE(qlinear_runs_direct(dw, 9)) << bits;
    check_uploaded(wo, dw, 20, seed, &ref_o);
    seed += 2;
    qweight_free(dw);
  }
}

// The host layout and its kernel (GYRE_CUDA_BITS_STREAM=0) on the same awkward shapes.
TEST(CudaQbits, HostLayoutKernelMatchesFloat64) {
  if (!qtest::have_gpu()) GTEST_SKIP() << "no CUDA device";
  qlinear_detail::set_bits_stream(0);
  const int shapes[][2] = {{1, 96}, {77, 1056}, {301, 2560}};
  uint32_t seed = 700;
  for (const Narrow& l : kLayouts)
    for (const auto& s : shapes) {
      if (s[1] % l.group != 0) continue;
      const QWeightHost w = make_weight(l.bits, l.group, l.asym, l.perm, s[0], s[1], seed++);
      for (const int n : {1, 8, 9}) {
        SCOPED_TRACE(std::to_string(l.bits) + "b rows " + std::to_string(s[0]) + " n " +
                     std::to_string(n));
        check_matmul(w, n, seed++);
      }
    }
  qlinear_detail::set_bits_stream(-1);
}

// The benchmark knob's other configuration (4 weight rows per warp) on odd row counts.
TEST(CudaQbits, FourRowsPerWarpMatchesFloat64) {
  if (!qtest::have_gpu()) GTEST_SKIP() << "no CUDA device";
  qlinear_detail::set_bits_stream(0);
  qlinear_detail::set_bits_rows(4);
  uint32_t seed = 500;
  for (const Narrow& l : kLayouts) {
    const QWeightHost w = make_weight(l.bits, l.group, l.asym, l.perm, 75, 1152, seed++);
    for (const int n : {1, 5, 8}) check_matmul(w, n, seed++);
  }
  qlinear_detail::set_bits_rows(0);
  qlinear_detail::set_bits_stream(-1);
}

// Enough rows for the no-split-K configuration (>= 4096 rows).
TEST(CudaQbits, TallWeightMatchesFloat64) {
  if (!qtest::have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int bits : {3, 6}) {
    const QWeightHost w = make_weight(bits, 128, false, false, 4099, 256, 40u + bits);
    for (const int n : {1, 8}) check_matmul(w, n, 50u + n);
  }
}

TEST(CudaQbits, SplitOutputsMatchTheWholeWeight) {
  if (!qtest::have_gpu()) GTEST_SKIP() << "no CUDA device";
  const QWeightHost w = make_weight(5, 32, false, false, 70, 1056, 7);
  for (const int n : {3, 9, 70}) {  // the GEMV, the batch kernel, two passes of it
    const int cols = w.desc.cols;
    const std::vector<uint16_t> xh = random_halves(size_t(n) * cols, 1.0f, 70u + n);
    QWeightDevice dw = qweight_upload(w);
    Halves x(size_t(n) * cols), a(size_t(n) * 21), b(size_t(n) * 8), c(size_t(n) * 41);
    x.upload(xh);
    a.poison();
    b.poison();
    c.poison();
    cuda::OutSplit s;
    s.out[0] = a.p;
    s.out[1] = b.p;
    s.out[2] = c.p;
    s.end[0] = 21;
    s.end[1] = 29;
    s.end[2] = 70;
    s.parts = 3;
    qlinear_matmul_split(dw, x.p, s, n, nullptr, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const auto ah = a.download(), bh = b.download(), ch = c.download();
    qweight_free(dw);
    std::vector<uint16_t> y(size_t(n) * 70);
    for (int t = 0; t < n; ++t) {
      std::copy_n(ah.begin() + t * 21, 21, y.begin() + t * 70);
      std::copy_n(bh.begin() + t * 8, 8, y.begin() + t * 70 + 21);
      std::copy_n(ch.begin() + t * 41, 41, y.begin() + t * 70 + 29);
    }
    expect_close(w, xh, {}, y, n);
  }
}

// The FP16 dequantization (prefill path): each value is the reference's float value rounded to
// FP16 (the GPU rounds s*q+m once; the reference in float, then to FP16: at most one FP16 ulp).
TEST(CudaQbits, DequantizeMatchesReference) {
  if (!qtest::have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Tiled8 tiled8;
  uint32_t seed = 300;
  for (const int pieces : {-1, 0, 1, 2, 4, 8})  // host layout, tiled by width, 1/2/4/8 blocks
    for (const Narrow& l : kLayouts) {
      qlinear_detail::set_bits_stream(pieces < 0 ? 0 : -1);
      qlinear_detail::set_bits_stream_pieces(std::max(pieces, 0));
      const QWeightHost w = make_weight(l.bits, l.group, l.asym, l.perm, 37, 1152, seed++);
      QWeightDevice dw = qweight_upload(w);
      qlinear_detail::set_bits_stream(-1);
      qlinear_detail::set_bits_stream_pieces(0);
      ASSERT_EQ(dw.narrow_tiled > 0, pieces >= 0);
      if (pieces > 0) {
        ASSERT_EQ(dw.narrow_tiled, l.bits == 8 ? 1 : pieces == 8 && l.bits != 2 ? 4 : pieces);
      }
      expect_dequantized(dw, dequantized(w), std::to_string(l.bits) + "b");
      if (HasFatalFailure()) return;
    }
}

// Every piece size of the tiled layout (1, 2, 4, 8 blocks: block counts padded), a larger warp
// budget, and weights whose rows are too long for the tiled layout (x of one token must fit
// shared memory): they keep the host layout and its kernel.
TEST(CudaQbits, StreamPiecesAndLongRowsMatchFloat64) {
  if (!qtest::have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Tiled8 tiled8;
  qlinear_detail::set_bits_batch(0);  // the stream GEMV at n = 7 too
  const qtest::AtExit reset([] { qlinear_detail::set_bits_batch(-1); });
  uint32_t seed = 900;
  for (const int pieces : {1, 2, 4, 8}) {  // 8: 2 bits (the others take 4)
    qlinear_detail::set_bits_stream_pieces(pieces);
    qlinear_detail::set_bits_stream_warps(pieces == 2 ? 64 : 0);
    for (const Narrow& l : kLayouts)
      for (const int cols : {2080, 2176}) {
        if (cols % l.group != 0) continue;
        const QWeightHost w = make_weight(l.bits, l.group, l.asym, l.perm, 45, cols, seed++);
        for (const int n : {1, 2, 7}) check_matmul(w, n, seed++);
      }
  }
  qlinear_detail::set_bits_stream_pieces(0);
  qlinear_detail::set_bits_stream_warps(0);
  const QWeightHost w = make_weight(3, 32, false, false, 5, kQlinearTiledBitsMaxCols + 32, 950);
  QWeightDevice dw = qweight_upload(w);
  EXPECT_EQ(dw.narrow_tiled, 0);
  EXPECT_FALSE(qlinear_fuses_norm(dw, 1));
  qweight_free(dw);
  check_matmul(w, 2, 951);
}

// x RMS-normalised (the reference normalises in float and rounds to FP16, as the rmsnorm kernel
// does) and y += x W, alone and together, n = 1..8 (12288 columns: two tokens per pass over the
// weight, x staged per pass).
TEST(CudaQbits, FusedNormAndAccumulateMatchFloat64) {
  if (!qtest::have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Tiled8 tiled8;
  const float eps = 1e-5f;
  uint32_t seed = 1200;
  const int shapes[][2] = {{50, 1056}, {33, 12288}};
  for (const Narrow& l : kLayouts)
    for (const auto& sh : shapes) {
      const int rows = sh[0], cols = sh[1];
      if (cols % l.group != 0) continue;
      const QWeightHost w = make_weight(l.bits, l.group, l.asym, l.perm, rows, cols, seed++);
      const std::vector<uint16_t> xh = random_halves(size_t(8) * cols, 3.0f, seed++);
      const std::vector<uint16_t> nh = random_halves(cols, 1.5f, seed++);
      const std::vector<uint16_t> y0 = random_halves(size_t(8) * rows, 2.0f, seed++);
      const std::vector<uint16_t> xn = qtest::rms_normed(xh, nh, 8, cols, eps);
      const std::vector<double> wf = dequantized(w);
      QWeightDevice dw = qweight_upload(w);
      Halves x(size_t(8) * cols), y(size_t(8) * rows), norm(cols);
      x.upload(xh);
      norm.upload(nh);
      // The stream GEMV at every n (the batch kernel off), then y += on the batch kernel (from 5
      // rows by default; the norm is not fused there).
      // The batch kernel takes no odd count of blocks at 2/3 bits, symmetric (one-block pieces,
      // two to its unit): the GEMV, with the norm, runs those.
      const bool batch_takes = !(l.bits <= 3 && !l.asym && ((cols + 63) / 64) % 2 == 1);
      for (const int n : {1, 2, 5, 8, -5, -8}) {
        qlinear_detail::set_bits_batch(n > 0 ? 0 : -1);
        ASSERT_EQ(qlinear_fuses_norm(dw, std::abs(n)), n > 0 || !batch_takes);
        for (int mode = n > 0 ? 0 : 1; mode < (n > 0 ? 3 : 2); ++mode) {  // norm, y +=, both
          SCOPED_TRACE(std::to_string(l.bits) + "b g" + std::to_string(l.group) + " cols " +
                       std::to_string(cols) + " n " + std::to_string(n) + " mode " +
                       std::to_string(mode));
          QlinearFusion f;
          f.accumulate = mode != 0;
          if (mode != 1) {
            f.norm_w = norm.p;
            f.norm_eps = eps;
          }
          if (f.accumulate) {
            y.upload(y0);
          } else {
            y.poison();
          }
          qlinear_matmul(dw, x.p, y.p, std::abs(n), nullptr, nullptr, f);
          CUDA_OK(cudaDeviceSynchronize());
          std::vector<uint16_t> got = y.download();
          // y += x W: the reference adds the old y as a bias per token.
          for (int t = 0; t < std::abs(n); ++t) {
            std::vector<uint16_t> gt(got.begin() + size_t(t) * rows,
                                     got.begin() + size_t(t + 1) * rows);
            std::vector<uint16_t> bias;
            if (f.accumulate)
              bias.assign(y0.begin() + size_t(t) * rows, y0.begin() + size_t(t + 1) * rows);
            const std::vector<uint16_t>& xs = mode == 1 ? xh : xn;
            std::vector<uint16_t> xt(xs.begin() + size_t(t) * cols,
                                     xs.begin() + size_t(t + 1) * cols);
            expect_close(w, xt, bias, gt, 1, &wf);
            if (HasFatalFailure()) break;
          }
          if (HasFatalFailure()) break;
        }
        if (HasFatalFailure()) break;
      }
      qlinear_detail::set_bits_batch(-1);
      qweight_free(dw);
      if (HasFatalFailure()) return;
    }
}

// Gate/up weights interleaved by 8 rows (out_split.h) with the SwiGLU epilogue: out[t, h] =
// silu(gate_h . x_t) * (up_h . x_t) against float64, hidden sizes not multiples of 8 or 16.
TEST(CudaQbits, SwigluMatchesFloat64) {
  if (!qtest::have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Tiled8 tiled8;
  uint32_t seed = 1500;
  for (const Narrow& l : kLayouts)
    for (const int hidden : {13, 40}) {
      const int cols = 1152;
      const QWeightHost gate = make_weight(l.bits, l.group, l.asym, l.perm, hidden, cols, seed++);
      // up in the same layout (the same permutation, as qweight_interleave_rows requires)
      std::mt19937 rng(seed++);
      std::normal_distribution<float> nd(0.0f, 0.03f);
      std::vector<float> uw(size_t(hidden) * cols);
      for (float& v : uw) v = nd(rng);
      const QWeightHost up = qweight_pack_from_f32(uw.data(), hidden, cols, l.bits, l.group, l.asym,
                                                   l.perm ? gate.perm.data() : nullptr);
      const QWeightHost fused = qweight_interleave_rows(gate, up, cuda::kSwigluBlock);
      const std::vector<double> gf = dequantized(gate), uf = dequantized(up);
      QWeightDevice dw = qweight_upload(fused);
      for (const int n : {1, 3, 8, 9, 40, 72}) {  // the GEMV, then the batch kernel
        const std::vector<uint16_t> xh = random_halves(size_t(n) * cols, 1.0f, seed++);
        Halves x(size_t(n) * cols), out(size_t(n) * hidden);
        x.upload(xh);
        out.poison();
        ASSERT_TRUE(qlinear_gemv_swiglu(dw, x.p, out.p, n, hidden, nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        const std::vector<uint16_t> got = out.download();
        for (int t = 0; t < n; ++t)
          for (int h = 0; h < hidden; ++h) {
            double g = 0, u = 0, gm = 0, um = 0;
            for (int c = 0; c < cols; ++c) {
              const double xv = f16_to_f32(xh[size_t(t) * cols + c]);
              g += xv * gf[size_t(h) * cols + c];
              u += xv * uf[size_t(h) * cols + c];
              gm += std::fabs(xv * gf[size_t(h) * cols + c]);
              um += std::fabs(xv * uf[size_t(h) * cols + c]);
            }
            const double sg = g / (1.0 + std::exp(-g)), want = sg * u;
            // d silu / dg <= 1.1: errors of 4e-3 of the magnitudes in g and u, plus FP16 output.
            const double tol = 4e-3 * (1.1 * gm * (std::fabs(u) + um) + std::fabs(sg) * um) +
                               2e-3 * std::fabs(want) + 1e-6;
            const double v = f16_to_f32(got[size_t(t) * hidden + h]);
            ASSERT_FALSE(std::isnan(v)) << "unwritten out[" << t << ", " << h << "]";
            ASSERT_NEAR(v, want, tol) << l.bits << "b hidden " << hidden << " n " << n;
          }
      }
      qweight_free(dw);
    }
  // The host layout (GYRE_CUDA_BITS_STREAM=0) has no SwiGLU epilogue: declined, nothing launched.
  qlinear_detail::set_bits_stream(0);
  const QWeightHost w = make_weight(3, 64, false, false, 32, 1152, seed++);
  QWeightDevice dw = qweight_upload(w);
  qlinear_detail::set_bits_stream(-1);
  ASSERT_EQ(dw.narrow_tiled, 0);
  Halves x(size_t(2) * 1152), out(size_t(2) * 13);
  for (const int n : {1, 2}) EXPECT_FALSE(qlinear_gemv_swiglu(dw, x.p, out.p, n, 13, nullptr));
  qweight_free(dw);
}

}  // namespace
}  // namespace gyre
#endif  // GYRE_HAVE_CUDA
