// Element types of weights and activations. Quantized types are blocks of elements along a row
// (the GGUF block layouts); a row's byte size is (n / block_elems) * block_bytes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace gyre {

enum class DType : uint8_t {
  F32,
  F16,
  BF16,
  I32,
  Q8_0,  // 32 elems: f16 scale + 32 x int8
  Q4_0,  // 32 elems: f16 scale + 16 bytes of nibbles, value = (q - 8) * d
  Q4_1,  // 32 elems: f16 scale, f16 min + 16 bytes of nibbles, value = q * d + m
  Q4_K,  // 256 elems, 144 bytes
  Q5_K,  // 256 elems, 176 bytes
  Q6_K,  // 256 elems, 210 bytes
  // Not a file type: a linear weight already in Gyre's quantized layout (a QWeightHost of
  // backend/cpu/qlinear_ref.h, made by a loader such as GPTQ's); the TensorView's data points at
  // that object and rows have no byte size (0).
  QPACKED,
  I16,  // integer tables of some checkpoints (EXL2's q_groups); never a weight
};

struct DTypeInfo {
  const char* name;
  int block_elems;
  int block_bytes;
  bool quantized;
};

const DTypeInfo& dtype_info(DType t);
inline const char* dtype_name(DType t) {
  return dtype_info(t).name;
}

// Bytes of a row of n elements; throws if n is not a whole number of blocks.
size_t dtype_row_bytes(DType t, int64_t n);

// Parses "F32", "f16", "bf16", "q4_0", ...; throws on an unknown name.
DType dtype_from_name(std::string_view name);

}  // namespace gyre
