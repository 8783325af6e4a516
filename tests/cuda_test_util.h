// The CUDA backend for the tests that compare it against the CPU backend: whether a device is
// present, and a backend made with given options (nullptr when built without CUDA), so that the
// test files need no #ifdef of their own around these.
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "backend/backend.h"
#ifdef GYRE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace gyre::ctest {

inline bool have_gpu() {
#ifdef GYRE_HAVE_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

inline std::unique_ptr<Backend> cuda_backend(const BackendOptions& options = {}) {
#ifdef GYRE_HAVE_CUDA
  return make_cuda_backend(0, options);
#else
  (void)options;
  return nullptr;
#endif
}

// With the KV cache type `kv_cache` (f16, q8, q4).
inline std::unique_ptr<Backend> cuda_backend(const std::string& kv_cache) {
  BackendOptions o;
  o.kv_cache = kv_cache;
  return cuda_backend(o);
}

}  // namespace gyre::ctest

#define GYRE_SKIP_WITHOUT_GPU() \
  if (!::gyre::ctest::have_gpu()) GTEST_SKIP() << "no CUDA device (or built without CUDA)"
