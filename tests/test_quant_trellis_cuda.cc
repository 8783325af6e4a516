// The trellis encoder and LDLQ on the GPU (quant/cuda/trellis_cuda.h, GptqDevice with a trellis
// setting) against the CPU: the Viterbi of quant/trellis_encode.h tile by tile (errors equal up
// to float rounding, exact recovery of representable streams), and the LDLQ against the
// converter's gptq_quantize_trellis and a float64 loop written here from the agreed algorithm
// (TRELLIS.md) on top of the CPU encoder, with no lazy blocks. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/trellis.h"
#include "core/half.h"
#include "quant/gptq.h"
#include "quant/gptq_device.h"
#include "quant/gptq_trellis.h"
#include "quant/measure.h"
#include "quant/trellis_encode.h"
#include "quant/unit_quant.h"
#ifdef GYRE_HAVE_CUDA
#include "quant/cuda/trellis_cuda.h"
#endif

namespace gyre::quant {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

// Host-pointer GPU encoder (unreachable without CUDA: the tests skip first).
void gpu_encode(const std::vector<float>& t, const std::vector<float>& sc, int64_t tiles, int k,
                std::vector<uint32_t>& words, std::vector<double>& err) {
  words.assign(static_cast<size_t>(tiles) * trellis_tile_words(k), 0);
  err.assign(static_cast<size_t>(tiles), 0.0);
#ifdef GYRE_HAVE_CUDA
  cuda::trellis_encode_tiles_host(t.data(), sc.data(), tiles, k, words.data(), err.data());
#else
  (void)t, (void)sc;
#endif
}

// Gaussian targets; per tile a base scale, per position the scale of its row (rows of a tile
// belong to different weight rows, so their scales differ).
void random_tiles(int64_t tiles, uint32_t seed, std::vector<float>& t, std::vector<float>& sc) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ud(0.3f, 3.0f);
  t.resize(static_cast<size_t>(tiles) * kTrellisTileElems);
  sc.resize(t.size());
  for (int64_t i = 0; i < tiles; ++i) {
    const float base = ud(rng);
    float row_scale[kTrellisTileDim];
    for (float& s : row_scale) s = base * ud(rng) / float(kTrellisCodeRms);
    for (int p = 0; p < kTrellisTileElems; ++p) {
      int r = 0, c = 0;
      trellis_position(p, r, c);
      const size_t at = static_cast<size_t>(i) * kTrellisTileElems + p;
      sc[at] = row_scale[r];
      t[at] = nd(rng) * row_scale[r] * float(kTrellisCodeRms);
    }
  }
}

double decoded_error(const float* t, const float* sc, const uint32_t* words, int k) {
  double e = 0.0;
  for (int p = 0; p < kTrellisTileElems; ++p) {
    const double d = double(t[p]) - double(sc[p]) * trellis_code(trellis_state(words, k, p));
    e += d * d;
  }
  return e;
}

TEST(QuantTrellisCuda, EncoderMatchesTheCpuViterbi) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kTiles = 6;
  for (int k : {2, 3, 4, 5, 6, 8}) {
    std::vector<float> t, sc;
    random_tiles(kTiles, 100 + k, t, sc);
    std::vector<uint32_t> words;
    std::vector<double> err;
    gpu_encode(t, sc, kTiles, k, words, err);
    int same_streams = 0;
    for (int64_t i = 0; i < kTiles; ++i) {
      const float* ti = t.data() + i * kTrellisTileElems;
      const float* si = sc.data() + i * kTrellisTileElems;
      const uint32_t* wi = words.data() + i * trellis_tile_words(k);
      std::vector<uint32_t> cpu_words(static_cast<size_t>(trellis_tile_words(k)));
      const double cpu_err = trellis_encode_tile(ti, si, k, cpu_words.data());
      // The GPU's reported error is that of its words, and equals the CPU's optimum.
      EXPECT_NEAR(err[i], decoded_error(ti, si, wi, k), 1e-6 * cpu_err) << "K=" << k;
      EXPECT_NEAR(err[i], cpu_err, 1e-5 * cpu_err) << "K=" << k << " tile " << i;
      same_streams += std::equal(cpu_words.begin(), cpu_words.end(), wi);
    }
    std::printf("K=%d: %d of %d streams bit-identical to the CPU's\n", k, same_streams,
                int(kTiles));
  }
}

// The fast kernel (the default) against the first one (GYRE_TRELLIS_ENCODER_OLD=1): the same
// decisions, so the same words; errors equal up to the summation order. Many tiles per block, so
// that the fast kernel's traceback during the next tile's pass 1 is exercised.
TEST(QuantTrellisCuda, FastEncoderMatchesTheOldOne) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kTiles = 2500;
  for (int k : {2, 3, 4, 5, 6, 8}) {
    std::vector<float> t, sc;
    random_tiles(kTiles, 200 + k, t, sc);
    std::vector<uint32_t> fast_words, old_words;
    std::vector<double> fast_err, old_err;
    gpu_encode(t, sc, kTiles, k, fast_words, fast_err);
    setenv("GYRE_TRELLIS_ENCODER_OLD", "1", 1);
    gpu_encode(t, sc, kTiles, k, old_words, old_err);
    unsetenv("GYRE_TRELLIS_ENCODER_OLD");
    const int w = trellis_tile_words(k);
    int64_t same = 0;
    for (int64_t i = 0; i < kTiles; ++i) {
      same += std::equal(old_words.begin() + i * w, old_words.begin() + (i + 1) * w,
                         fast_words.begin() + i * w);
      EXPECT_NEAR(fast_err[i], old_err[i], 1e-9 * old_err[i]) << "K=" << k << " tile " << i;
    }
    EXPECT_EQ(same, kTiles) << "K=" << k;
    std::printf("K=%d: %lld of %lld fast streams equal to the old kernel's\n", k,
                static_cast<long long>(same), static_cast<long long>(kTiles));
  }
}

TEST(QuantTrellisCuda, RepresentableStreamsAreRecovered) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kTiles = 16;
  std::mt19937 rng(5);
  for (int k : {2, 3, 4, 5, 6, 8}) {
    const int nw = trellis_tile_words(k);
    std::vector<uint32_t> truth(static_cast<size_t>(kTiles) * nw);
    for (uint32_t& w : truth) w = rng();
    std::vector<float> t(static_cast<size_t>(kTiles) * kTrellisTileElems), sc(t.size());
    for (int64_t i = 0; i < kTiles; ++i)
      for (int p = 0; p < kTrellisTileElems; ++p) {
        const size_t at = static_cast<size_t>(i) * kTrellisTileElems + p;
        // Dyadic scales: scale * code is exact in float, so the error is exactly 0.
        sc[at] = float(1 + (i + p / 64) % 3) / 128.0f;
        t[at] = sc[at] * float(trellis_code(trellis_state(truth.data() + i * nw, k, p)));
      }
    std::vector<uint32_t> words;
    std::vector<double> err;
    gpu_encode(t, sc, kTiles, k, words, err);
    for (int64_t i = 0; i < kTiles; ++i) {
      EXPECT_EQ(err[i], 0.0) << "K=" << k << " tile " << i;
      int16_t want[kTrellisTileElems], got[kTrellisTileElems];
      trellis_decode_tile(truth.data() + i * nw, k, want);
      trellis_decode_tile(words.data() + i * nw, k, got);
      for (int e = 0; e < kTrellisTileElems; ++e)
        ASSERT_EQ(got[e], want[e]) << "K=" << k << " tile " << i << " element " << e;
    }
  }
}

TEST(QuantTrellisCuda, Throughput) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kTiles = 20000;
  // MSE per element on unit Gaussians, measured with the CPU encoder (trellis_encode.h).
  const double cpu_mse[9] = {0, 0, 0.0696, 0.0182, 0.0045, 0, 0, 0, 0};
  for (int k : {4, 2, 3}) {
    std::vector<float> t(static_cast<size_t>(kTiles) * kTrellisTileElems), sc(t.size(), 0.0f);
    std::mt19937 rng(9);
    std::normal_distribution<float> nd;
    for (float& v : t) v = nd(rng);
    for (float& s : sc) s = float(1.0 / kTrellisCodeRms);
    std::vector<uint32_t> words;
    std::vector<double> err;
    // The old kernel first (GYRE_TRELLIS_ENCODER_OLD=1), for comparison; then the default.
    setenv("GYRE_TRELLIS_ENCODER_OLD", "1", 1);
    gpu_encode(t, sc, 64, k, words, err);  // warm-up (module load)
    auto t0 = std::chrono::steady_clock::now();
    gpu_encode(t, sc, kTiles, k, words, err);
    double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    unsetenv("GYRE_TRELLIS_ENCODER_OLD");
    std::printf("trellis GPU encoder K=%d, old kernel: %.0f tiles/s\n", k, double(kTiles) / sec);
    gpu_encode(t, sc, 64, k, words, err);  // warm-up (module load)
    t0 = std::chrono::steady_clock::now();
    gpu_encode(t, sc, kTiles, k, words, err);
    sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double total = 0.0;
    for (double e : err) total += e;
    const double mse = total / double(t.size());
    std::printf("trellis GPU encoder K=%d: %lld tiles in %.3f s = %.0f tiles/s, MSE %.5f\n", k,
                static_cast<long long>(kTiles), sec, double(kTiles) / sec, mse);
    EXPECT_NEAR(mse, cpu_mse[k], 0.1 * cpu_mse[k]) << "K=" << k;
  }
}

std::vector<float> correlated_input(int tokens, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(tokens) * n);
  for (int t = 0; t < tokens; ++t) {
    const float common = nd(rng);
    for (int c = 0; c < n; ++c)
      x[static_cast<size_t>(t) * n + c] = c == 5 ? 0.0f : 0.7f * common + nd(rng) * (1 + c % 7);
  }
  return x;
}

// The agreed LDLQ in float64, written plainly: every block's update reaches all later columns at
// once (no lazy 128-column batches), on the CPU encoder.
QuantizedWeight reference_ldlq(const std::vector<float>& w, int rows, int cols,
                               const GptqPrep& prep, const QuantSetting& st) {
  const int k = st.bits, gs = st.group_size, groups = cols / gs, nw = trellis_tile_words(k);
  std::vector<double> cur(w.size());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      cur[size_t(r) * cols + c] = prep.dead[c] ? 0.0 : w[size_t(r) * cols + c];
  QuantizedWeight q;
  q.setting = st;
  q.rows = rows;
  q.cols = cols;
  q.dequant.assign(w.size(), 0.0f);
  q.scales.assign(size_t(rows) * groups, 0);
  q.trellis.assign(size_t(rows / 16) * (cols / 16) * nw, 0);
  auto u = [&](int a, int b) { return prep.u[size_t(a) * cols + b]; };
  for (int j = 0; j < cols; j += 16) {
    const int g = j / gs;
    if (j % gs == 0)
      for (int r = 0; r < rows; ++r) {
        double ss = 0.0;
        for (int c = j; c < j + gs; ++c)
          ss += cur[size_t(r) * cols + c] * cur[size_t(r) * cols + c];
        q.scales[size_t(r) * groups + g] =
            f32_to_f16(float(std::sqrt(ss / gs) / kTrellisCodeRms * kTrellisScaleFit));
      }
    for (int tr = 0; tr < rows / 16; ++tr) {
      float t[kTrellisTileElems], sc[kTrellisTileElems];
      for (int p = 0; p < kTrellisTileElems; ++p) {
        int row = 0, col = 0;
        trellis_position(p, row, col);
        const int r = tr * 16 + row;
        t[p] = float(cur[size_t(r) * cols + j + col]);
        sc[p] = f16_to_f32(q.scales[size_t(r) * groups + g]);
      }
      uint32_t* words = q.trellis.data() + (size_t(tr) * (cols / 16) + j / 16) * nw;
      trellis_encode_tile(t, sc, k, words);
      int16_t codes[kTrellisTileElems];
      trellis_decode_tile(words, k, codes);
      for (int row = 0; row < 16; ++row) {
        const int r = tr * 16 + row;
        double* wr = cur.data() + size_t(r) * cols;
        const float s = f16_to_f32(q.scales[size_t(r) * groups + g]);
        double e[16];
        for (int c = 0; c < 16; ++c) {
          const float deq = s * float(codes[row * 16 + c]);
          q.dequant[size_t(r) * cols + j + c] = deq;
          double d = wr[j + c] - deq;  // solve E U[b, b] = T - Q
          for (int i = 0; i < c; ++i) d -= e[i] * u(j + i, j + c);
          e[c] = d / u(j + c, j + c);
        }
        for (int col = j + 16; col < cols; ++col)
          for (int c = 0; c < 16; ++c) wr[col] -= e[c] * u(j + c, col);
      }
    }
  }
  return q;
}

TEST(QuantTrellisCuda, LdlqMatchesAFloat64Reference) {
  SKIP_WITHOUT_GPU();
  constexpr int kTokens = 400, kRows = 64, kCols = 256;
  constexpr double kDamp = 0.01;
  const std::vector<float> x = correlated_input(kTokens, kCols, 3);
  std::vector<float> w(size_t(kRows) * kCols);
  std::mt19937 rng(4);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (float& v : w) v = nd(rng);
  const std::vector<double> h = hessian_of(x, kTokens, kCols, 2);
  const GptqPrep prep = gptq_prepare(h, kCols, kDamp, false);
  auto gpu = make_gptq_device("cuda");
  for (int k : {4, 2}) {
    QuantSetting st;
    st.bits = k;
    st.group_size = 64;
    st.trellis = true;
    const QuantizedWeight ref = reference_ldlq(w, kRows, kCols, prep, st);
    const double ref_err = relative_error(w.data(), ref, h, 2);
    // The converter's CPU LDLQ (gptq_trellis.h, lazy 128-column updates) agrees with both.
    const QuantizedWeight cpu = gptq_quantize_trellis(w.data(), kRows, kCols, prep, st, 2);
    const double cpu_err = relative_error(w.data(), cpu, h, 2);
    EXPECT_NEAR(cpu_err, ref_err, 0.02 * ref_err) << "K=" << k;
    ASSERT_EQ(cpu.trellis.size(), ref.trellis.size());
    for (bool act_order : {false, true}) {  // the trellis path factors H in natural order anyway
      gpu->set_input(x.data(), kTokens, kCols, kDamp, act_order, false);
      double gpu_err = 0.0;
      const QuantizedWeight q = gpu->quantize(w.data(), kRows, st, &gpu_err);
      ASSERT_EQ(q.dequant.size(), ref.dequant.size());
      ASSERT_EQ(q.scales.size(), ref.scales.size());
      ASSERT_EQ(q.trellis.size(), ref.trellis.size());
      EXPECT_TRUE(q.q.empty());
      EXPECT_NEAR(gpu_err, ref_err, 0.02 * ref_err) << "K=" << k;
      // The GPU's error measure is the CPU's relative_error of its own output.
      EXPECT_NEAR(gpu_err, relative_error(w.data(), q, h, 2), 1e-6 * gpu_err);
      // The first group's scales see the weight before any update: identical.
      for (int r = 0; r < kRows; ++r) EXPECT_EQ(q.scales[size_t(r) * 4], ref.scales[size_t(r) * 4]);
      // dequant is exactly scale * code of the stored words (the loader's view).
      for (int tr = 0; tr < kRows / 16; ++tr)
        for (int tc = 0; tc < kCols / 16; ++tc) {
          int16_t codes[kTrellisTileElems];
          trellis_decode_tile(q.trellis.data() + (size_t(tr) * (kCols / 16) + tc) * 8 * k, k,
                              codes);
          for (int e = 0; e < kTrellisTileElems; ++e) {
            const int r = tr * 16 + e / 16, c = tc * 16 + e % 16;
            const float s = f16_to_f32(q.scales[size_t(r) * 4 + c / 64]);
            ASSERT_EQ(q.dequant[size_t(r) * kCols + c], s * float(codes[e])) << r << "," << c;
          }
        }
      const std::vector<double> errs = gpu->errors(w.data(), kRows, {st});
      EXPECT_NEAR(errs[0], gpu_err, 1e-9 * gpu_err);
      EXPECT_NEAR(gpu_err, cpu_err, 0.02 * cpu_err) << "K=" << k;
      ASSERT_EQ(q.scales.size(), cpu.scales.size());
      std::printf(
          "LDLQ K=%d act_order=%d: relative error GPU %.6f, gptq_quantize_trellis %.6f, float64 "
          "loop %.6f\n",
          k, int(act_order), gpu_err, cpu_err, ref_err);
    }
  }
}

// The converter's path: a rotated unit's UnitQuantizer with a GPU runs the GPU LDLQ, whose
// result agrees with the CPU UnitQuantizer's.
TEST(QuantTrellisCuda, UnitQuantizerOnTheGpuMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  constexpr int kTokens = 300, kRows = 48, kCols = 256;
  QuantContext cpu_ctx;
  cpu_ctx.hadamard = true;
  cpu_ctx.threads = 2;
  QuantContext gpu_ctx = cpu_ctx;
  auto gpu = make_gptq_device("cuda");
  gpu_ctx.gpu = gpu.get();
  const std::vector<float> x = correlated_input(kTokens, kCols, 8);
  std::vector<float> w(size_t(kRows) * kCols);
  std::mt19937 rng(6);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (float& v : w) v = nd(rng);
  UnitQuantizer on_cpu(cpu_ctx), on_gpu(gpu_ctx);
  on_cpu.set_input(x, kTokens, "model.layers.0.mlp.gate_proj");
  on_gpu.set_input(x, kTokens, "model.layers.0.mlp.gate_proj");
  const QuantSetting st = trellis_setting(3, kCols);
  ASSERT_TRUE(st.trellis);
  double err_cpu = -1, err_gpu = -1;
  const QuantizedWeight a = on_cpu.quantize(w, st, &err_cpu), b = on_gpu.quantize(w, st, &err_gpu);
  EXPECT_TRUE(b.had.active());
  ASSERT_EQ(a.trellis.size(), b.trellis.size());
  ASSERT_EQ(a.scales.size(), b.scales.size());
  ASSERT_EQ(a.dequant.size(), b.dequant.size());
  EXPECT_NEAR(err_gpu, err_cpu, 0.02 * err_cpu);
  EXPECT_NEAR(on_gpu.errors(w, {st})[0], err_gpu, 1e-9 * err_gpu);
  std::printf("UnitQuantizer trellis 3b: relative error GPU %.6f, CPU %.6f\n", err_gpu, err_cpu);
}

// The measurement's stacked sweep (every candidate K of a weight in one LDLQ, GptqDevice::errors)
// gives the errors of separate runs, on awkward sizes (3 tile rows, 3 lazy blocks with a short
// last one, a dead input column), more settings than one stack holds (repeats must agree), and
// at K = 2 and 8 the CPU's gptq_quantize_trellis to its usual tolerance.
TEST(QuantTrellisCuda, StackedCandidatesMatchSeparateRuns) {
  SKIP_WITHOUT_GPU();
  constexpr int kTokens = 350, kRows = 48, kCols = 320;
  const std::vector<float> x = correlated_input(kTokens, kCols, 21);
  std::vector<float> w(size_t(kRows) * kCols);
  std::mt19937 rng(22);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (float& v : w) v = nd(rng);
  const std::vector<double> h = hessian_of(x, kTokens, kCols, 2);
  const GptqPrep prep = gptq_prepare(h, kCols, 0.01, false);
  auto gpu = make_gptq_device("cuda");
  std::vector<QuantSetting> settings;
  for (int k : {2, 3, 4, 5, 6, 8, 4, 2, 8}) {
    QuantSetting st;
    st.bits = k;
    st.group_size = 64;
    st.trellis = true;
    settings.push_back(st);
  }
  settings.insert(settings.begin() + 3, QuantSetting{4, 64, true});  // a scalar one between
  for (bool act_order : {false, true}) {
    gpu->set_input(x.data(), kTokens, kCols, 0.01, act_order, false);
    const std::vector<double> stacked = gpu->errors(w.data(), kRows, settings);
    ASSERT_EQ(stacked.size(), settings.size());
    EXPECT_NEAR(stacked[3], gpu->errors(w.data(), kRows, {settings[3]})[0], 1e-9 * stacked[3]);
    for (size_t i = 0; i < settings.size(); ++i) {
      const QuantSetting& st = settings[i];
      if (!st.trellis) continue;
      double alone = 0.0;
      gpu->quantize(w.data(), kRows, st, &alone);
      EXPECT_NEAR(stacked[i], alone, 1e-6 * alone) << "K=" << st.bits << " at " << i;
      std::printf("stacked K=%d act_order=%d: relative error %.6f, alone %.6f\n", st.bits,
                  int(act_order), stacked[i], alone);
      if (act_order || i > 6 || (st.bits != 2 && st.bits != 8)) continue;
      const QuantizedWeight cpu = gptq_quantize_trellis(w.data(), kRows, kCols, prep, st, 2);
      const double cpu_err = relative_error(w.data(), cpu, h, 2);
      EXPECT_NEAR(stacked[i], cpu_err, 0.02 * cpu_err) << "K=" << st.bits;
    }
  }
}

// The measurement's path: a weight taller than kTrellisMeasureRows is measured on its sample,
// K = 2, 3, 4 stacked on the GPU, with the CPU UnitQuantizer's errors (the LDLQ's tolerance).
TEST(QuantTrellisCuda, UnitQuantizerMeasuresTheSampleStacked) {
  SKIP_WITHOUT_GPU();
  constexpr int kTokens = 300, kRows = kTrellisMeasureRows + 48, kCols = 64;
  QuantContext cpu_ctx;
  cpu_ctx.hadamard = true;
  cpu_ctx.threads = 2;
  QuantContext gpu_ctx = cpu_ctx;
  auto gpu = make_gptq_device("cuda");
  gpu_ctx.gpu = gpu.get();
  const std::vector<float> x = correlated_input(kTokens, kCols, 31);
  std::vector<float> w(size_t(kRows) * kCols);
  std::mt19937 rng(32);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  for (float& v : w) v = nd(rng);
  UnitQuantizer on_cpu(cpu_ctx), on_gpu(gpu_ctx);
  on_cpu.set_input(x, kTokens, "model.layers.0.self_attn.q_proj");
  on_gpu.set_input(x, kTokens, "model.layers.0.self_attn.q_proj");
  std::vector<QuantSetting> cands = trellis_candidates(kCols);
  cands.resize(3);
  ASSERT_EQ(cands[2].bits, 4);
  const std::vector<double> a = on_cpu.errors(w, cands), b = on_gpu.errors(w, cands);
  ASSERT_EQ(a.size(), cands.size());
  ASSERT_EQ(b.size(), cands.size());
  for (size_t i = 0; i < cands.size(); ++i) {
    EXPECT_NEAR(b[i], a[i], 0.02 * a[i]) << cands[i].str();
    if (i > 0) {
      EXPECT_LT(b[i], b[i - 1]) << "more bits, less error";
    }
  }
}

// An 8B-shaped layer (4096 x 4096, 65536 tiles) at K = 4: the LDLQ's time, and its error against
// scalar GPTQ at 4 bits on the same weight and Hessian (trellis must be well below it).
TEST(QuantTrellisCuda, LdlqOnAnEightBShapedLayer) {
  SKIP_WITHOUT_GPU();
  constexpr int kTokens = 512, kN = 4096;
  const std::vector<float> x = correlated_input(kTokens, kN, 12);
  std::vector<float> w(size_t(kN) * kN);
  std::mt19937 rng(13);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  for (float& v : w) v = nd(rng);
  auto gpu = make_gptq_device("cuda");
  gpu->set_input(x.data(), kTokens, kN, 0.01, false, false);
  QuantSetting st;
  st.bits = 4;
  st.group_size = 128;
  st.trellis = true;
  QuantSetting scalar = st;
  scalar.trellis = false;
  const double scalar_err = gpu->errors(w.data(), kN, {scalar})[0];
  double err = 0.0;
  const auto t0 = std::chrono::steady_clock::now();
  const QuantizedWeight q = gpu->quantize(w.data(), kN, st, &err);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(q.trellis.size(), size_t(kN / 16) * (kN / 16) * 32);
  EXPECT_LT(err, 0.7 * scalar_err);
  std::printf(
      "LDLQ 4096x4096 K=4: %.3f s (%.0f tiles/s), relative error %.6f (scalar GPTQ 4b "
      "g128: %.6f)\n",
      sec, double(kN / 16) * (kN / 16) / sec, err, scalar_err);
}

}  // namespace
}  // namespace gyre::quant
