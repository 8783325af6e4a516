// The sensitivity pass's KL reduction on the GPU (quant/sensitivity.cc), for logits that the
// CUDA backend left on the device: at the Llama-3 vocabulary one unit's logits are 2048 x 128256,
// and copying them to the host and reducing there cost more than the forward that made them.
// C++17, no Gyre types (nvcc compiles the .cu files as C++17).
#pragma once
#include <cstddef>
#include <cstdint>

namespace gyre::quant::cuda {

// Mean over rows of KL(softmax(ref) || softmax(logits)) for two device FP16 matrices
// [rows, vocab] (row-major), each row in float64 as mean_kl_of_logits does on the host; the
// per-row values are summed on the host in row order. Synchronous.
double mean_kl_f16(const void* ref, const void* logits, int64_t rows, int64_t vocab);

// Bytes of device memory in use now (total - free) on the current device; 0 without one.
size_t device_memory_used();

}  // namespace gyre::quant::cuda
