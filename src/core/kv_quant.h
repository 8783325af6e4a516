// Quantized KV cache rows (`--cache q8|q4`), shared by the CPU caches and, in the same layout, by
// the CUDA kernels (backend/cuda/kv_quant.cuh).
//
// A row is the keys (or values) of one position and one KV head: head_dim values, cut into
// blocks of kKvBlock = 32 consecutive dims (the last block is shorter when head_dim % 32 != 0).
// Each row is stored as two parts, kept in separate planes so the codes stay aligned for vector
// loads:
//   codes  q8: head_dim int8, one per value            (x = scale * c,        c in [-127, 127])
//          q4: ceil(head_dim / 2) bytes, dim d in byte d/2, low nibble for even d
//                                                       (x = min + scale * c, c in [0, 15])
//   params q8: one FP16 scale per block (amax / 127)
//          q4: FP16 (scale, min) per block (scale = (max - min) / 15, min = block minimum)
// Bytes per value: q8 1 + 2/32 = 1.0625, q4 0.5 + 4/32 = 0.625 (FP16: 2).
// Why q4 keeps a minimum: keys have a few outlier channels per head, so one block's values are
// far from symmetric around zero; with a symmetric 4-bit code (scale = amax / 7) half of the
// levels sit where no values are. Measured on real keys (docs/kv_cache.md) the min form has the
// lower round-trip error; q8's 255 levels make a minimum pointless.
// Codes are computed against the FP16-rounded scale and min, so dequantization reproduces exactly
// what quantization assumed; a block of equal values gets scale 0 and decodes exactly.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace gyre {

enum class KvType { F16, Q8, Q4 };

constexpr int kKvBlock = 32;

// "f16", "q8" or "q4"; throws gyre::Error on anything else.
KvType parse_kv_type(const std::string& name);
const char* kv_type_name(KvType t);

inline int kv_blocks(int head_dim) {
  return (head_dim + kKvBlock - 1) / kKvBlock;
}
// Bytes of one row's codes (F16: the halves themselves).
inline size_t kv_code_bytes(KvType t, int head_dim) {
  const size_t d = static_cast<size_t>(head_dim);
  return t == KvType::Q8 ? d : t == KvType::Q4 ? (d + 1) / 2 : 2 * d;
}
// FP16 parameters of one row.
inline size_t kv_param_halves(KvType t, int head_dim) {
  const size_t b = static_cast<size_t>(kv_blocks(head_dim));
  return t == KvType::Q8 ? b : t == KvType::Q4 ? 2 * b : 0;
}
inline size_t kv_row_bytes(KvType t, int head_dim) {
  return kv_code_bytes(t, head_dim) + 2 * kv_param_halves(t, head_dim);
}

// One row of Q8 or Q4 (F16 is not a quantized type here: callers store those rows themselves).
// Non-finite inputs are stored as 0 (never undefined behaviour on hostile activations).
void kv_quantize_row(KvType t, const float* x, int head_dim, uint8_t* codes, uint16_t* params);
void kv_dequantize_row(KvType t, const uint8_t* codes, const uint16_t* params, int head_dim,
                       float* out);

}  // namespace gyre
