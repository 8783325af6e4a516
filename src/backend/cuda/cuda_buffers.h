// Device and pinned-host allocations of the CUDA backend, with errors that say what was asked
// for and what the device has free.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

namespace gyre::cuda {

// Device memory freed when the last owner goes; throws gyre::Error on failure naming `what`.
std::shared_ptr<void> device_alloc(size_t bytes, const std::string& what);
std::shared_ptr<void> pinned_alloc(size_t bytes, const std::string& what);
inline double mib(size_t bytes) {
  return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

}  // namespace gyre::cuda
