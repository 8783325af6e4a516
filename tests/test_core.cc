// Core: half/bfloat16 conversions against exhaustive round trips and float64 rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "core/half.h"

namespace gyre {
namespace {

TEST(Half, EveryF16RoundTripsThroughF32) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), h) << "h=" << h;
  }
}

TEST(Half, F32ToF16RoundsToNearestEven) {
  // Every f16 neighbour pair: the midpoint rounds to the even one, just off it to the nearer.
  for (uint32_t h = 0; h < 0x7bff; ++h) {
    const double a = f16_to_f32(static_cast<uint16_t>(h));
    const double b = f16_to_f32(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((a + b) / 2);
    const uint16_t even = (h % 2 == 0) ? static_cast<uint16_t>(h) : static_cast<uint16_t>(h + 1);
    ASSERT_EQ(f32_to_f16(mid), even) << "h=" << h;
    ASSERT_EQ(f32_to_f16(std::nextafter(mid, 0.0f)), h) << "h=" << h;
    ASSERT_EQ(f32_to_f16(std::nextafter(mid, 1e9f)), h + 1) << "h=" << h;
  }
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e6f), 0xfc00);
}

TEST(Half, Bf16RoundTripAndRounding) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(f32_to_bf16(f), h);
    }
  }
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256), f32_to_bf16(1.0f));  // tie to even
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
}

TEST(DType, RowBytesAndNames) {
  EXPECT_EQ(dtype_row_bytes(DType::Q4_K, 512), 288u);
  EXPECT_EQ(dtype_row_bytes(DType::F16, 7), 14u);
  EXPECT_THROW(dtype_row_bytes(DType::Q8_0, 33), Error);
  EXPECT_EQ(dtype_from_name("q6_k"), DType::Q6_K);
  EXPECT_THROW(dtype_from_name("q3_x"), Error);
}

}  // namespace
}  // namespace gyre
