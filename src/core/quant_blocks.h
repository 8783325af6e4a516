// The GGUF block-quantized layouts (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K): dequantization of
// whole blocks to floats, and round-to-nearest quantization of floats (used by tests and tools).
// The layouts follow the GGUF specification; every function works on n elements, n a multiple
// of the type's block size.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace gyre {

void dequantize_blocks(DType t, const void* src, float* dst, int64_t n);

// Round-to-nearest quantization of n floats into Q8_0, Q4_0 or Q4_1 blocks (other types
// throw). For tests and tools; not tuned for quality.
void quantize_blocks(DType t, const float* src, void* dst, int64_t n);

}  // namespace gyre
