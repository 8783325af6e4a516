// What the GPU sampling kernel can serve and its per-row parameters for a SampleRequest, shared by
// CudaBackend::sample (cuda_sample.cc) and the fed decode steps (cuda_fed.cc).
#pragma once
#include "backend/backend.h"
#include "backend/cuda/sampling.h"

namespace gyre::cuda {

// Penalties need the row rewritten and typical_p sorts by entropy distance: the host does them.
bool sample_kernel_serves(const SampleRequest& r);
SampleRowParams sample_row_params(const SampleRequest& r);
// GYRE_CUDA_SAMPLE_MODE=N picks the kernel's implementation bits (sampling.h), for comparisons.
int sample_kernel_mode();

}  // namespace gyre::cuda
