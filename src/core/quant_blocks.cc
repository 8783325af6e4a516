// Block layouts (GGUF / ggml), all little-endian, "d"/"dmin" are IEEE half:
//   Q8_0 (34 B / 32):  d, int8 q[32]                          x = d * q
//   Q4_0 (18 B / 32):  d, u8 qs[16]; low nibbles are elements 0..15, high nibbles 16..31,
//                      x = d * (q - 8)
//   Q4_1 (20 B / 32):  d, m, u8 qs[16] (nibbles as Q4_0)      x = d * q + m
//   Q4_K (144 B / 256): d, dmin, u8 scales[12] (8 six-bit scales and 8 six-bit mins),
//                      u8 qs[128]; 4 chunks of 64 elements, each 32 bytes of qs: low nibbles
//                      are sub-block 2c, high nibbles sub-block 2c+1; x = d*sc*q - dmin*m
//   Q5_K (176 B / 256): d, dmin, scales[12], u8 qh[32], u8 qs[128]; as Q4_K with a fifth bit:
//                      bit j of qh[l] is the high bit of element l of sub-block j
//   Q6_K (210 B / 256): u8 ql[128], u8 qh[64], int8 scales[16], d; two halves of 128 elements,
//                      each from 64 bytes of ql and 32 of qh; x = d * scale * (q - 32)
// The arithmetic is ordered as gguf-py's reference does it (scale products first, separate
// multiply and add), so results match it bit for bit; contraction into FMA is switched off
// because it would change the rounding.
#include "core/quant_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace gyre {

namespace {

float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

void store_f16(uint8_t* p, float f) {
  const uint16_t h = f32_to_f16(f);
  std::memcpy(p, &h, 2);
}

void dequant_q8_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  for (int i = 0; i < 32; ++i) y[i] = static_cast<float>(static_cast<int8_t>(b[2 + i])) * d;
}

void dequant_q4_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint8_t* qs = b + 2;
  for (int i = 0; i < 16; ++i) {
    y[i] = d * static_cast<float>((qs[i] & 0x0f) - 8);
    y[i + 16] = d * static_cast<float>((qs[i] >> 4) - 8);
  }
}

void dequant_q4_1(const uint8_t* b, float* y) {
  const float d = load_f16(b), m = load_f16(b + 2);
  const uint8_t* qs = b + 4;
  for (int i = 0; i < 16; ++i) {
    y[i] = d * static_cast<float>(qs[i] & 0x0f) + m;
    y[i + 16] = d * static_cast<float>(qs[i] >> 4) + m;
  }
}

// The 12 scale bytes of Q4_K/Q5_K hold 8 six-bit scales and 8 six-bit mins: sub-blocks 0..3
// use the low 6 bits of bytes 0..3 (scale) and 4..7 (min); sub-blocks 4..7 take their low
// 4 bits from the nibbles of bytes 8..11 and their top 2 bits from the top of bytes 0..7.
void k_scale_min(const uint8_t* s, int j, int& sc, int& mn) {
  if (j < 4) {
    sc = s[j] & 63;
    mn = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Shared by Q4_K (qh == nullptr) and Q5_K.
void dequant_k4_k5(const uint8_t* b, const uint8_t* qh, const uint8_t* qs, float* y) {
  const float d = load_f16(b), dmin = load_f16(b + 2);
  const uint8_t* scales = b + 4;
  for (int sub = 0; sub < 8; ++sub) {
    int sc, mn;
    k_scale_min(scales, sub, sc, mn);
    const float ds = d * static_cast<float>(sc);
    const float dm = dmin * static_cast<float>(mn);
    const uint8_t* q = qs + 32 * (sub / 2);
    const int shift = (sub % 2) * 4;
    for (int l = 0; l < 32; ++l) {
      int v = (q[l] >> shift) & 0x0f;
      if (qh != nullptr) v |= ((qh[l] >> sub) & 1) << 4;
      y[32 * sub + l] = ds * static_cast<float>(v) - dm;
    }
  }
}

void dequant_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = load_f16(b + 208);
  for (int half = 0; half < 2; ++half) {
    // Element 32*k + l of this half (k = 0..3): low 4 bits from ql[l + 32*(k%2)] (low nibble
    // for k < 2, high nibble otherwise), high 2 bits from bits 2k..2k+1 of qh[l];
    // scale index 2*(k) + l/16 of this half's 8.
    for (int k = 0; k < 4; ++k) {
      for (int l = 0; l < 32; ++l) {
        const int lo = (ql[l + 32 * (k % 2)] >> (4 * (k / 2))) & 0x0f;
        const int hi = (qh[l] >> (2 * k)) & 3;
        const float ds = d * static_cast<float>(sc[2 * k + l / 16]);
        y[32 * k + l] = ds * static_cast<float>((lo | (hi << 4)) - 32);
      }
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

}  // namespace

void dequantize_blocks(DType t, const void* src, float* dst, int64_t n) {
  const DTypeInfo& info = dtype_info(t);
  GYRE_CHECK(info.quantized, "dequantize_blocks: ", info.name, " is not a block type");
  GYRE_CHECK(n >= 0 && n % info.block_elems == 0, "dequantize_blocks: ", n,
             " elements are not a whole number of ", info.name, " blocks");
  const auto* b = static_cast<const uint8_t*>(src);
  const int64_t blocks = n / info.block_elems;
  for (int64_t i = 0; i < blocks; ++i, b += info.block_bytes, dst += info.block_elems) {
    switch (t) {
      case DType::Q8_0:
        dequant_q8_0(b, dst);
        break;
      case DType::Q4_0:
        dequant_q4_0(b, dst);
        break;
      case DType::Q4_1:
        dequant_q4_1(b, dst);
        break;
      case DType::Q4_K:
        dequant_k4_k5(b, nullptr, b + 16, dst);
        break;
      case DType::Q5_K:
        dequant_k4_k5(b, b + 16, b + 48, dst);
        break;
      case DType::Q6_K:
        dequant_q6_k(b, dst);
        break;
      default:
        fail("dequantize_blocks: unsupported type ", info.name);
    }
  }
}

// Round-to-nearest quantizers, for tests and tools: the scale is chosen from the block's
// extreme values, each element takes the nearest level. Not tuned for quality.
void quantize_blocks(DType t, const float* src, void* dst, int64_t n) {
  const DTypeInfo& info = dtype_info(t);
  GYRE_CHECK(t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_1,
             "quantize_blocks: ", info.name, " is not supported (Q8_0, Q4_0 and Q4_1 are)");
  GYRE_CHECK(n >= 0 && n % 32 == 0, "quantize_blocks: ", n,
             " elements are not a whole number of blocks");
  auto* b = static_cast<uint8_t*>(dst);
  for (int64_t blk = 0; blk < n / 32; ++blk, src += 32, b += info.block_bytes) {
    float lo = src[0], hi = src[0], amax = 0.0f, signed_max = 0.0f;
    for (int i = 0; i < 32; ++i) {
      lo = std::fmin(lo, src[i]);
      hi = std::fmax(hi, src[i]);
      if (std::fabs(src[i]) > amax) {
        amax = std::fabs(src[i]);
        signed_max = src[i];
      }
    }
    if (t == DType::Q8_0) {
      const float d = amax / 127.0f;
      const float inv = d == 0.0f ? 0.0f : 1.0f / d;
      store_f16(b, d);
      for (int i = 0; i < 32; ++i)
        b[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(src[i] * inv)));
    } else if (t == DType::Q4_0) {
      // The largest magnitude maps to level -8 exactly, so the range is [-8, 7] * |d|.
      const float d = signed_max / -8.0f;
      const float inv = d == 0.0f ? 0.0f : 1.0f / d;
      store_f16(b, d);
      for (int i = 0; i < 16; ++i) {
        auto q = [&](float x) {
          return static_cast<uint8_t>(std::clamp(std::lround(x * inv) + 8, 0L, 15L));
        };
        b[2 + i] = static_cast<uint8_t>(q(src[i]) | (q(src[i + 16]) << 4));
      }
    } else {
      const float d = (hi - lo) / 15.0f;
      const float inv = d == 0.0f ? 0.0f : 1.0f / d;
      store_f16(b, d);
      store_f16(b + 2, lo);
      for (int i = 0; i < 16; ++i) {
        auto q = [&](float x) {
          return static_cast<uint8_t>(std::clamp(std::lround((x - lo) * inv), 0L, 15L));
        };
        b[4 + i] = static_cast<uint8_t>(q(src[i]) | (q(src[i + 16]) << 4));
      }
    }
  }
}

}  // namespace gyre
