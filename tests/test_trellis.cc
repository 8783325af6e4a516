// Trellis-coded weights (backend/cpu/trellis.h, quant/trellis_encode.h): the codebook's
// statistics, the tile order, exact recovery of any stream's own values (which a wrong
// tail-biting constraint, backtrack or bit placement breaks), and the encoder's error on
// Gaussian data against the Lloyd-Max scalar quantizer's (Max, 1960), the bound TCQ must beat.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "backend/cpu/trellis.h"
#include "quant/trellis_encode.h"

namespace gyre {
namespace {

TEST(Trellis, CodebookMatchesItsDocumentedStatistics) {
  double sum2 = 0.0;
  int lo = 1 << 20, hi = -(1 << 20);
  for (uint32_t s = 0; s < (1u << 16); ++s) {
    const int c = trellis_code(s);
    // The mask: bits above 16 never matter.
    ASSERT_EQ(c, trellis_code(s | 0xABCD0000u));
    sum2 += double(c) * c;
    lo = std::min(lo, c);
    hi = std::max(hi, c);
  }
  EXPECT_EQ(lo, -490);
  EXPECT_EQ(hi, 485);
  EXPECT_NEAR(std::sqrt(sum2 / 65536.0), kTrellisCodeRms, 1e-3);
}

TEST(Trellis, PositionsCoverTheTileOnce) {
  std::set<int> seen;
  for (int p = 0; p < kTrellisTileElems; ++p) {
    int r = -1, c = -1;
    trellis_position(p, r, c);
    ASSERT_TRUE(r >= 0 && r < 16 && c >= 0 && c < 16);
    seen.insert(r * 16 + c);
  }
  EXPECT_EQ(seen.size(), 256u);
  int r = 0, c = 0;
  trellis_position(8 * 5 + 6, r, c);  // lane 5 (g 1, t 1), register 6: (g + 8, 2t + 8)
  EXPECT_EQ(r, 9);
  EXPECT_EQ(c, 10);
}

// State p read bit by bit from the words, independently of trellis_state's word arithmetic.
uint32_t state_by_bits(const std::vector<uint32_t>& w, int k, int p) {
  const int nbits = 256 * k;
  uint32_t s = 0;
  for (int i = 0; i < 16; ++i) {
    const int b = (k * p + i) % nbits;
    s |= ((w[b / 32] >> (b % 32)) & 1u) << i;
  }
  return s;
}

TEST(Trellis, EncoderRecoversAnyStreamExactly) {
  std::mt19937 rng(7);
  for (int k : {2, 3, 4, 5, 6, 8}) {
    std::vector<uint32_t> truth(trellis_tile_words(k)), got(trellis_tile_words(k));
    for (auto& x : truth) x = rng();
    std::vector<float> t(256), sc(256);
    for (int p = 0; p < 256; ++p) {
      ASSERT_EQ(trellis_state(truth.data(), k, p), state_by_bits(truth, k, p));
      sc[p] = 0.01f * float(1 + p % 5);
      t[p] = sc[p] * float(trellis_code(state_by_bits(truth, k, p)));
    }
    const double err = quant::trellis_encode_tile(t.data(), sc.data(), k, got.data());
    EXPECT_LT(err, 1e-9) << "k " << k;  // zero up to the rounding of sc * code (FMA)
    std::vector<int16_t> a(256), b(256);
    trellis_decode_tile(truth.data(), k, a.data());
    trellis_decode_tile(got.data(), k, b.data());
    EXPECT_EQ(a, b) << "k " << k;
  }
}

TEST(Trellis, BeatsTheBestScalarQuantizerOnGaussianData) {
  // Lloyd-Max MSE of a unit Gaussian at 2, 3, 4 bits; TCQ should cut it by about half.
  const double lloyd_max[] = {0, 0, 0.1175, 0.03454, 0.009497};
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  for (int k : {2, 3, 4}) {
    double mse = 0.0;
    const int tiles = 3;
    for (int i = 0; i < tiles; ++i) {
      std::vector<float> t(256), sc(256, float(1.0 / kTrellisCodeRms));
      for (auto& x : t) x = nd(rng);
      std::vector<uint32_t> w(trellis_tile_words(k));
      const double err = quant::trellis_encode_tile(t.data(), sc.data(), k, w.data());
      // The returned error is the decoded stream's.
      std::vector<int16_t> codes(256);
      trellis_decode_tile(w.data(), k, codes.data());
      double check = 0.0;
      for (int p = 0; p < 256; ++p) {
        int r = 0, c = 0;
        trellis_position(p, r, c);
        const double e = t[p] - sc[p] * float(codes[r * 16 + c]);
        check += e * e;
      }
      EXPECT_NEAR(err, check, 1e-6 * (1.0 + check));
      mse += err / 256.0 / tiles;
    }
    EXPECT_LT(mse, 0.65 * lloyd_max[k]) << "k " << k;
    EXPECT_GT(mse, 0.25 * lloyd_max[k]) << "k " << k;  // below the rate-distortion bound: a bug
    std::printf("trellis k=%d: MSE %.5f (Lloyd-Max %.5f)\n", k, mse, lloyd_max[k]);
  }
}

}  // namespace
}  // namespace gyre
