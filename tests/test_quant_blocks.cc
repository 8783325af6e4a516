// Block dequantization against gguf-py (gguf.quants.dequantize, the Python package of llama.cpp):
// tests/data/quant_<TYPE>.bin holds random blocks, quant_<TYPE>.f32 gguf-py's floats for them
// (tools/make_gguf_fixtures.py). Gyre orders the arithmetic as gguf-py does, so the comparison
// is bit-exact (float bit patterns, -0.0 included).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/mapped_file.h"
#include "core/quant_blocks.h"
#include "core/tensor.h"

namespace gyre {
namespace {

const std::string kData = std::string(GYRE_SOURCE_DIR) + "/tests/data/";

class QuantBlocksVsGgufPy : public ::testing::TestWithParam<DType> {};

TEST_P(QuantBlocksVsGgufPy, BitExact) {
  const DType t = GetParam();
  const std::string name = dtype_name(t);
  const std::string blocks = read_text_file(kData + "quant_" + name + ".bin");
  const std::string expected = read_text_file(kData + "quant_" + name + ".f32");
  const DTypeInfo& info = dtype_info(t);
  ASSERT_EQ(blocks.size() % static_cast<size_t>(info.block_bytes), 0u);
  const int64_t n = static_cast<int64_t>(blocks.size() / info.block_bytes) * info.block_elems;
  ASSERT_EQ(expected.size(), static_cast<size_t>(n) * 4);
  // An unaligned source buffer: GGUF data may sit at any address.
  std::vector<uint8_t> src(blocks.size() + 1);
  std::memcpy(src.data() + 1, blocks.data(), blocks.size());
  std::vector<float> got(static_cast<size_t>(n));
  dequantize_row(t, src.data() + 1, got.data(), n);
  int mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t want_bits, got_bits;
    std::memcpy(&want_bits, expected.data() + 4 * i, 4);
    std::memcpy(&got_bits, &got[static_cast<size_t>(i)], 4);
    if (want_bits != got_bits && ++mismatches <= 5) {
      float want;
      std::memcpy(&want, &want_bits, 4);
      ADD_FAILURE() << name << " element " << i << ": got " << got[static_cast<size_t>(i)]
                    << ", gguf-py " << want;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, QuantBlocksVsGgufPy,
                         ::testing::Values(DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q4_K,
                                           DType::Q5_K, DType::Q6_K),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

// Round trip through Gyre's quantizers: each element must land within half a quantization step
// of its value (a whole step for Q4_0's clamped end) (computed in float64 from the block's own
// scale), plus the f16 rounding of the scale itself.
TEST(QuantBlocks, RoundTripWithinHalfStep) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t n = 32 * 64;
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = dist(rng) * 0.05f;
  for (int i = 0; i < 32; ++i) x[static_cast<size_t>(i)] = 0.0f;  // an all-zero block
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_1}) {
    std::vector<uint8_t> q(dtype_row_bytes(t, n));
    quantize_blocks(t, x.data(), q.data(), n);
    std::vector<float> y(static_cast<size_t>(n));
    dequantize_blocks(t, q.data(), y.data(), n);
    for (int64_t b = 0; b < n / 32; ++b) {
      double lo = 1e30, hi = -1e30, amax = 0;
      for (int i = 0; i < 32; ++i) {
        const double v = x[static_cast<size_t>(b * 32 + i)];
        lo = std::min(lo, v);
        hi = std::max(hi, v);
        amax = std::max(amax, std::fabs(v));
      }
      const double step = t == DType::Q8_0   ? amax / 127
                          : t == DType::Q4_0 ? amax / 8
                                             : (hi - lo) / 15;
      for (int i = 0; i < 32; ++i) {
        const size_t k = static_cast<size_t>(b * 32 + i);
        // Q4_0 has levels -8..7 times a scale set by the largest magnitude, so a value of the
        // other sign can be clamped a whole step short.
        const double steps = t == DType::Q4_0 ? 1.0 : 0.5;
        const double tol = steps * step + (amax + std::fabs(lo)) * 2e-3 + 1e-12;
        ASSERT_NEAR(y[k], x[k], tol) << dtype_name(t) << " block " << b << " elem " << i;
      }
    }
  }
}

TEST(QuantBlocks, RejectsPartialBlocksAndUnquantizableTypes) {
  std::vector<uint8_t> buf(1024);
  std::vector<float> f(512);
  EXPECT_THROW(dequantize_blocks(DType::Q4_K, buf.data(), f.data(), 32), Error);
  EXPECT_THROW(dequantize_blocks(DType::F32, buf.data(), f.data(), 32), Error);
  EXPECT_THROW(quantize_blocks(DType::Q6_K, f.data(), buf.data(), 256), Error);
  EXPECT_THROW(quantize_blocks(DType::Q8_0, f.data(), buf.data(), 33), Error);
}

}  // namespace
}  // namespace gyre
