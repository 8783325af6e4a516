// Gyre's quantized weight layout on the host: round-to-nearest packing against a float64
// nearest-level oracle, and GGUF repacks against core's dequantize_row, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/qlinear_ref.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/half.h"
#include "core/tensor.h"

namespace gyre {
namespace {

std::vector<float> random_weights(int rows, int cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(static_cast<size_t>(rows) * cols);
  for (float& x : w) x = normal(rng);
  // Outliers and special groups: a constant group, an all-zero group, one large value.
  for (int c = 0; c < 32 && c < cols; ++c) w[c] = 0.0f;
  if (rows > 1) {
    for (int c = 0; c < 32 && c < cols; ++c) w[cols + c] = -0.5f;
  }
  w[w.size() / 2] = 0.75f;
  return w;
}

double f16_round(double x) {
  return f16_to_f32(f32_to_f16(static_cast<float>(x)));
}

struct RtnCase {
  int bits, group;
  bool asym, perm;
};

class QlinearRefRtn : public ::testing::TestWithParam<RtnCase> {};

// Every dequantized element must be a nearest level of its group's grid (float64 oracle), and
// the group's scale the f16 rounding of the float64 formula.
TEST_P(QlinearRefRtn, PackIsRoundToNearest) {
  const RtnCase p = GetParam();
  const int rows = 5, cols = 512;
  const std::vector<float> w = random_weights(rows, cols, 7u + p.bits + p.group);
  std::vector<int32_t> perm(cols);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(3));
  const QWeightHost q = qweight_pack_from_f32(w.data(), rows, cols, p.bits, p.group, p.asym,
                                              p.perm ? perm.data() : nullptr);
  EXPECT_EQ(q.desc.qweight_bytes(), int64_t{rows} * cols * p.bits / 8);
  const int levels = 1 << p.bits, offset = levels / 2;
  std::vector<float> deq(cols);
  for (int r = 0; r < rows; ++r) {
    qweight_dequantize_row(q, r, deq.data());
    for (int g = 0; g < cols / p.group; ++g) {
      double lo = INFINITY, hi = -INFINITY, amax = 0;
      for (int i = 0; i < p.group; ++i) {
        const int c = g * p.group + i;
        const double x = w[r * cols + (p.perm ? perm[c] : c)];
        lo = std::min(lo, x);
        hi = std::max(hi, x);
        amax = std::max(amax, std::fabs(x));
      }
      const double s = f16_round(p.asym ? (hi - lo) / (levels - 1) : amax / (offset - 1));
      const double m = p.asym ? f16_round(lo) : 0.0;
      ASSERT_NEAR(q.scale(r, g), s, s * 1e-3) << "row " << r << " group " << g;
      if (p.asym) {
        ASSERT_EQ(q.min(r, g), m);
      }
      const double stored_s = q.scale(r, g);
      for (int i = 0; i < p.group; ++i) {
        const int c = g * p.group + i;
        const int orig = p.perm ? perm[c] : c;
        const double x = w[r * cols + orig];
        double best = INFINITY;
        for (int l = 0; l < levels; ++l) {
          const double level = p.asym ? stored_s * l + m : stored_s * (l - offset);
          best = std::min(best, std::fabs(level - x));
        }
        ASSERT_LE(std::fabs(deq[orig] - x), best + 1e-6 * stored_s + 1e-12)
            << "row " << r << " col " << orig;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, QlinearRefRtn,
    ::testing::Values(RtnCase{4, 32, false, false}, RtnCase{4, 64, true, false},
                      RtnCase{4, 128, false, true}, RtnCase{4, 128, true, true},
                      RtnCase{8, 16, false, false}, RtnCase{8, 32, true, false},
                      RtnCase{8, 128, false, true}, RtnCase{2, 32, false, false},
                      RtnCase{3, 64, true, false}, RtnCase{5, 128, false, true},
                      RtnCase{6, 32, true, true}));

TEST(QlinearRef, BitsPerWeightCountsScales) {
  QWeightDesc d;
  d.bits = 4;
  d.group_size = 128;
  EXPECT_DOUBLE_EQ(d.bits_per_weight(), 4.125);
  d.asymmetric = true;
  EXPECT_DOUBLE_EQ(d.bits_per_weight(), 4.25);
}

// Random bytes are valid blocks once the f16 scale fields hold finite values.
std::vector<uint8_t> random_blocks(DType t, int rows, int cols, uint32_t seed) {
  const DTypeInfo& info = dtype_info(t);
  const size_t n_blocks = static_cast<size_t>(rows) * cols / info.block_elems;
  std::vector<uint8_t> b(n_blocks * info.block_bytes + 1);  // +1: the data starts unaligned
  std::mt19937 rng(seed);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  auto put_half = [&](uint8_t* p) {
    const uint16_t h = f32_to_f16(scale(rng));
    std::memcpy(p, &h, 2);
  };
  for (size_t i = 0; i < n_blocks; ++i) {
    uint8_t* blk = b.data() + 1 + i * info.block_bytes;
    switch (t) {
      case DType::Q4_1:
      case DType::Q4_K:
      case DType::Q5_K:
        put_half(blk);
        put_half(blk + 2);
        break;
      case DType::Q6_K:
        put_half(blk + 208);
        break;
      default:
        put_half(blk);
    }
  }
  return b;
}

class QlinearRefGguf : public ::testing::TestWithParam<DType> {};

TEST_P(QlinearRefGguf, RepackDequantizesBitIdentically) {
  const DType t = GetParam();
  const int rows = 3, cols = 512;
  const std::vector<uint8_t> blocks = random_blocks(t, rows, cols, 11);
  const QWeightHost q = qweight_pack_from_gguf(t, blocks.data() + 1, rows, cols);
  const size_t row_bytes = dtype_row_bytes(t, cols);
  std::vector<float> want(cols), got(cols);
  for (int r = 0; r < rows; ++r) {
    dequantize_row(t, blocks.data() + 1 + r * row_bytes, want.data(), cols);
    qweight_dequantize_row(q, r, got.data());
    for (int c = 0; c < cols; ++c) {
      uint32_t a, b;
      std::memcpy(&a, &want[c], 4);
      std::memcpy(&b, &got[c], 4);
      ASSERT_EQ(a, b) << dtype_name(t) << " row " << r << " col " << c << ": " << want[c] << " vs "
                      << got[c];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, QlinearRefGguf,
                         ::testing::Values(DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q4_K,
                                           DType::Q5_K, DType::Q6_K),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(QlinearRef, RejectsBadInput) {
  std::vector<float> w(64 * 4, 0.1f);
  EXPECT_THROW(qweight_pack_from_f32(w.data(), 4, 64, 7, 32, false), Error);
  EXPECT_THROW(qweight_pack_from_f32(w.data(), 4, 64, 4, 16, false), Error);  // < one chunk
  EXPECT_THROW(qweight_pack_from_f32(w.data(), 2, 96, 4, 64, false), Error);  // partial group
  EXPECT_THROW(qweight_pack_from_f32(w.data(), 0, 64, 4, 32, false), Error);
  std::vector<int32_t> perm(64, 0);
  EXPECT_THROW(qweight_pack_from_f32(w.data(), 4, 64, 4, 32, false, perm.data()), Error);
  w[5] = NAN;
  EXPECT_THROW(qweight_pack_from_f32(w.data(), 4, 64, 4, 32, false), Error);
  w[5] = 1e30f;
  EXPECT_THROW(qweight_pack_from_f32(w.data(), 4, 64, 4, 32, false), Error);
  std::vector<uint8_t> blocks(4096);
  EXPECT_THROW(qweight_pack_from_gguf(DType::Q4_K, blocks.data(), 1, 128), Error);
  EXPECT_THROW(qweight_pack_from_gguf(DType::F16, blocks.data(), 1, 128), Error);
}

// Oracle: each part's own dequantized rows (the fused weight must be their plain stack).
TEST(QlinearRef, ConcatRowsStacksParts) {
  for (const int bits : {4, 8}) {
    const int cols = 96;
    std::vector<QWeightHost> parts;
    int seed = 40, total = 0;
    for (const int rows : {5, 16, 3}) {
      const std::vector<float> w = random_weights(rows, cols, seed++);
      parts.push_back(qweight_pack_from_f32(w.data(), rows, cols, bits, 32, bits == 8));
      total += rows;
    }
    const QWeightHost fused = qweight_concat_rows({&parts[0], &parts[1], &parts[2]});
    ASSERT_EQ(fused.desc.rows, total);
    std::vector<float> got(cols), want(cols);
    int r = 0;
    for (const QWeightHost& part : parts) {
      for (int pr = 0; pr < part.desc.rows; ++pr, ++r) {
        qweight_dequantize_row(fused, r, got.data());
        qweight_dequantize_row(part, pr, want.data());
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(), cols * sizeof(float))) << "row " << r;
      }
    }
  }
  const std::vector<float> w = random_weights(4, 128, 7);
  const QWeightHost a = qweight_pack_from_f32(w.data(), 4, 64, 4, 32, false);
  const QWeightHost b = qweight_pack_from_f32(w.data(), 2, 128, 4, 32, false);
  const QWeightHost c = qweight_pack_from_f32(w.data(), 4, 64, 4, 64, false);
  EXPECT_THROW(qweight_concat_rows({&a, &b}), Error);  // columns differ
  EXPECT_THROW(qweight_concat_rows({&a, &c}), Error);  // group size differs
  EXPECT_THROW(qweight_concat_rows({}), Error);
}

}  // namespace
}  // namespace gyre
