#include "backend/cpu/cpu_kv_rows.h"

#include <cstring>

#include "backend/cpu/cpu_kernels.h"
#include "core/error.h"

namespace gyre {

CpuKvRows::CpuKvRows(KvType type, int head_dim, size_t n_rows)
    : type_(type),
      head_dim_(head_dim),
      code_bytes_(type == KvType::F16 ? static_cast<size_t>(head_dim) * sizeof(float)
                                      : kv_code_bytes(type, head_dim)),
      param_halves_(kv_param_halves(type, head_dim)) {
  const double total = static_cast<double>(n_rows) * (code_bytes_ + 2.0 * param_halves_);
  GYRE_CHECK(total < 1e15, "KV cache of ", total, " bytes is too large");
  bytes_ = n_rows * (code_bytes_ + 2 * param_halves_);
  // Left uninitialized (pages are touched as positions are written); callers track what is set.
  codes_ = alloc_aligned(n_rows * code_bytes_);
  if (param_halves_ > 0) params_ = alloc_aligned(n_rows * param_halves_ * 2);
}

void CpuKvRows::store(size_t row, const float* x) {
  uint8_t* codes = static_cast<uint8_t*>(codes_.get()) + row * code_bytes_;
  if (type_ == KvType::F16) {
    std::memcpy(codes, x, code_bytes_);
    return;
  }
  kv_quantize_row(type_, x, head_dim_, codes,
                  static_cast<uint16_t*>(params_.get()) + row * param_halves_);
}

const float* CpuKvRows::load(size_t row, float* scratch) const {
  const uint8_t* codes = static_cast<const uint8_t*>(codes_.get()) + row * code_bytes_;
  if (type_ == KvType::F16) return reinterpret_cast<const float*>(codes);
  kv_dequantize_row(type_, codes, static_cast<const uint16_t*>(params_.get()) + row * param_halves_,
                    head_dim_, scratch);
  return scratch;
}

void CpuKvRows::copy(size_t src, size_t dst, size_t n) {
  uint8_t* codes = static_cast<uint8_t*>(codes_.get());
  std::memcpy(codes + dst * code_bytes_, codes + src * code_bytes_, n * code_bytes_);
  if (param_halves_ == 0) return;
  uint16_t* params = static_cast<uint16_t*>(params_.get());
  std::memcpy(params + dst * param_halves_, params + src * param_halves_, n * param_halves_ * 2);
}

}  // namespace gyre
