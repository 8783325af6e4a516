// Rotated linear weights on the CUDA backend (backend/cpu/hadamard.h): the signs go to the device
// with the weight, and every matmul entry point runs x through hadamard_rotate into a scratch
// buffer first when its weight carries a rotation. The decode fusions of the RMSNorm into the
// GEMV are declined for such weights (fuses_norms), so they run norm -> rotate -> GEMV as
// separate launches; the residual-add epilogue still applies.
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
    signs = qweight_of(w).had_signs;
    block = qweight_of(w).had_block;
  }
  if (block == 0) return x;
  const size_t halves = static_cast<size_t>(n) * static_cast<size_t>(w.cols);
  if (halves > hadamard_scratch_halves_) {
    GYRE_CHECK(!capturing_, "internal: scratch growth while capturing a CUDA graph");
    drop_graph();  // a record may read the buffer replaced here
    hadamard_scratch_ = device_alloc(halves * sizeof(half), "the rotated-input scratch");
    hadamard_scratch_halves_ = halves;
  }
  auto* out = static_cast<half*>(hadamard_scratch_.get());
  hadamard_rotate(out, x, signs, n, static_cast<int>(w.cols), block, stream_);
  return out;
}

}  // namespace gyre::cuda
