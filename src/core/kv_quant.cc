#include "core/kv_quant.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/half.h"

namespace gyre {

namespace {

constexpr float kHalfMax = 65504.0f;

float finite_or_zero(float v) {
  return std::isfinite(v) ? v : 0.0f;
}

// Rounds v / step to the nearest code in [lo, hi]; step 0 gives lo-clamped 0.
int to_code(float v, float inv_step, int lo, int hi) {
  float c = std::nearbyint(v * inv_step);
  if (!(c >= static_cast<float>(lo))) c = static_cast<float>(lo);  // also NaN
  if (c > static_cast<float>(hi)) c = static_cast<float>(hi);
  return static_cast<int>(c);
}

void quantize_q8(const float* x, int n, int8_t* codes, uint16_t* scale_out) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(finite_or_zero(x[i])));
  const uint16_t sh = f32_to_f16(std::min(amax / 127.0f, kHalfMax));
  const float scale = f16_to_f32(sh);
  const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
  for (int i = 0; i < n; ++i)
    codes[i] = static_cast<int8_t>(to_code(finite_or_zero(x[i]), inv, -127, 127));
  *scale_out = sh;
}

void quantize_q4(const float* x, int n, int d0, uint8_t* codes, uint16_t* params) {
  float lo = finite_or_zero(x[0]), hi = lo;
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, finite_or_zero(x[i]));
    hi = std::max(hi, finite_or_zero(x[i]));
  }
  const uint16_t mh = f32_to_f16(std::clamp(lo, -kHalfMax, kHalfMax));
  const float mn = f16_to_f32(mh);
  const uint16_t sh = f32_to_f16(std::min((hi - mn) / 15.0f, kHalfMax));
  const float scale = f16_to_f32(sh);
  const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
  for (int i = 0; i < n; ++i) {
    const int c = to_code(finite_or_zero(x[i]) - mn, inv, 0, 15);
    const int d = d0 + i;
    uint8_t& byte = codes[d / 2];
    byte = (d % 2 == 0) ? static_cast<uint8_t>((byte & 0xF0) | c)
                        : static_cast<uint8_t>((byte & 0x0F) | (c << 4));
  }
  params[0] = sh;
  params[1] = mh;
}

}  // namespace

KvType parse_kv_type(const std::string& name) {
  if (name == "f16") return KvType::F16;
  if (name == "q8") return KvType::Q8;
  if (name == "q4") return KvType::Q4;
  fail("unknown KV cache type '", name, "' (expected f16, q8 or q4)");
}

const char* kv_type_name(KvType t) {
  return t == KvType::Q8 ? "q8" : t == KvType::Q4 ? "q4" : "f16";
}

void kv_quantize_row(KvType t, const float* x, int head_dim, uint8_t* codes, uint16_t* params) {
  GYRE_CHECK(t != KvType::F16 && head_dim > 0, "kv_quantize_row: not a quantized row");
  if (t == KvType::Q4) std::fill(codes, codes + kv_code_bytes(t, head_dim), uint8_t{0});
  for (int b = 0; b < kv_blocks(head_dim); ++b) {
    const int d0 = b * kKvBlock, n = std::min(kKvBlock, head_dim - d0);
    if (t == KvType::Q8)
      quantize_q8(x + d0, n, reinterpret_cast<int8_t*>(codes) + d0, params + b);
    else
      quantize_q4(x + d0, n, d0, codes, params + 2 * b);
  }
}

void kv_dequantize_row(KvType t, const uint8_t* codes, const uint16_t* params, int head_dim,
                       float* out) {
  GYRE_CHECK(t != KvType::F16 && head_dim > 0, "kv_dequantize_row: not a quantized row");
  for (int d = 0; d < head_dim; ++d) {
    const int b = d / kKvBlock;
    if (t == KvType::Q8) {
      out[d] = f16_to_f32(params[b]) * static_cast<float>(static_cast<int8_t>(codes[d]));
    } else {
      const int c = (d % 2 == 0) ? (codes[d / 2] & 0x0F) : (codes[d / 2] >> 4);
      out[d] = f16_to_f32(params[2 * b + 1]) + f16_to_f32(params[2 * b]) * static_cast<float>(c);
    }
  }
}

}  // namespace gyre
