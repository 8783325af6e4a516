// The CUDA backend (host-side entry points; compiled only when nvcc is found).
#pragma once
#include <memory>

#include "backend/backend.h"

namespace gyre {

int cuda_device_count();  // 0 when no driver or device
std::unique_ptr<Backend> make_cuda_backend(int device_index, const BackendOptions& options);

}  // namespace gyre
