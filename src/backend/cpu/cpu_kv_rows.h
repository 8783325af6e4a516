// Storage of KV cache rows for the CPU caches (contiguous and paged): one row is the keys or values
// of one position and KV head. "f16" rows are kept as f32 (the CPU backend is the exact
// reference; its activations are f32); q8/q4 rows use the format of core/kv_quant.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/kv_quant.h"

namespace gyre {

class CpuKvRows {
 public:
  CpuKvRows(KvType type, int head_dim, size_t n_rows);

  void store(size_t row, const float* x);
  // The row as f32: a pointer into the storage (f32 rows) or `scratch` (head_dim floats) holding
  // the dequantized values.
  const float* load(size_t row, float* scratch) const;
  // Copies rows [src, src + n) to [dst, dst + n) (ranges must not overlap).
  void copy(size_t src, size_t dst, size_t n);
  size_t bytes() const { return bytes_; }
  KvType type() const { return type_; }

 private:
  KvType type_;
  int head_dim_;
  size_t code_bytes_, param_halves_, bytes_;
  std::shared_ptr<void> codes_, params_;
};

}  // namespace gyre
