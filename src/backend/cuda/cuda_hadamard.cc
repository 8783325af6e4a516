// Rotated linear weights on the CUDA backend (backend/cpu/hadamard.h): the signs go to the device
// with the weight, and matmul entry points run x through hadamard_rotate (hadamard.cu: one warp
// per block, shuffles) into a scratch buffer first, once per unit input (q|k|v and gate|up are one
// fused weight). With GYRE_CUDA_FUSED_ROTATION=1 the decode GEMVs that stage x in shared memory
// (qlinear_fuses_rotation: 4-bit at n <= 2, tiled 2/3/5/6-bit at n <= 8) rotate it there instead,
// after the fused RMSNorm; off by default, as every GEMV block then rotates all of x before its
// weight stream starts, which measured 8% slower decode than the separate launch (H100,
// bench/qlinear_notes.md "Session 8: fused rotation").
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_buffers.h"
#include "backend/cuda/hadamard_device.h"
#include "backend/cuda/qmixed_device.h"

namespace gyre::cuda {

std::shared_ptr<void> upload_hadamard_signs(const HadamardRotation& had, int64_t cols) {
  hadamard_validate(had, cols, "CUDA upload");
  GYRE_CHECK(had.block <= kHadamardMaxBlock, "CUDA upload: hadamard block ", had.block,
             " exceeds the supported ", kHadamardMaxBlock);
  auto signs = device_alloc(had.signs.size(), "hadamard signs");
  GYRE_CUDA_CHECK(
      cudaMemcpy(signs.get(), had.signs.data(), had.signs.size(), cudaMemcpyHostToDevice));
  return signs;
}

const half* CudaBackend::rotated_input(const Tensor& w, const half* x, int n) {
  const int8_t* signs = nullptr;
  int block = 0;
  if (is_mixed_tensor(w)) {
    signs = qmixed_of(w).had_signs;
    block = qmixed_of(w).had_block;
  } else if (is_quantized_tensor(w)) {
    if (qlinear_fuses_rotation(qweight_of(w), n)) return x;  // the GEMV rotates in its staging
    signs = qweight_of(w).had_signs;
    block = qweight_of(w).had_block;
  }
  if (block == 0) return x;
  const size_t halves = static_cast<size_t>(n) * static_cast<size_t>(w.cols);
  grow(hadamard_scratch_, halves * sizeof(half), "the rotated-input scratch");
  auto* out = hadamard_scratch_.as<half>();
  hadamard_rotate(out, x, signs, n, static_cast<int>(w.cols), block, stream_);
  return out;
}

}  // namespace gyre::cuda
