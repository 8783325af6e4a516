#include "backend/cuda/cuda_buffers.h"

#include <cstdio>

#include "backend/cuda/cuda_common.h"

namespace gyre::cuda {

std::shared_ptr<void> device_alloc(size_t bytes, const std::string& what) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes > 0 ? bytes : 1);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error state
    size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    char line[256];
    std::snprintf(line, sizeof line, "%.1f MiB needed, %.1f MiB free of %.1f MiB", mib(bytes),
                  mib(free_b), mib(total_b));
    fail("out of GPU memory allocating ", what, ": ", line);
  }
  return std::shared_ptr<void>(p, [](void* q) { (void)cudaFree(q); });
}

std::shared_ptr<void> pinned_alloc(size_t bytes, const std::string& what) {
  void* p = nullptr;
  const cudaError_t err = cudaMallocHost(&p, bytes > 0 ? bytes : 1);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    fail("cannot allocate ", mib(bytes), " MiB of pinned host memory for ", what, ": ",
         cudaGetErrorString(err));
  }
  return std::shared_ptr<void>(p, [](void* q) { (void)cudaFreeHost(q); });
}

}  // namespace gyre::cuda
