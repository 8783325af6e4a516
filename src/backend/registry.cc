#include <string>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

#ifdef GYRE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace gyre {

bool cuda_available() {
#ifdef GYRE_HAVE_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

std::unique_ptr<Backend> backend_create(const std::string& device, int n_threads) {
  BackendOptions o;
  o.n_threads = n_threads;
  return backend_create(device, o);
}

std::unique_ptr<Backend> backend_create(const std::string& device, const BackendOptions& options) {
  const KvType kv_type = parse_kv_type(options.kv_cache);
  if (device == "cpu") return make_cpu_backend(options.n_threads, kv_type);
  if (device == "auto")
    return cuda_available() ? backend_create("cuda:0", options)
                            : make_cpu_backend(options.n_threads, kv_type);
  if (device == "cuda" || device.rfind("cuda:", 0) == 0) {
#ifdef GYRE_HAVE_CUDA
    int index = 0;
    if (device.size() > 5) {
      try {
        index = std::stoi(device.substr(5));
      } catch (const std::exception&) {
        fail("bad device '", device, "' (expected cuda:N)");
      }
    }
    const int count = cuda_device_count();
    GYRE_CHECK(index >= 0 && index < count, "device '", device, "' is not present (", count,
               " CUDA devices found)");
    return make_cuda_backend(index, options);
#else
    fail("this Gyre was built without CUDA; use --device cpu");
#endif
  }
  fail("unknown device '", device, "' (expected cpu, cuda, cuda:N or auto)");
}

}  // namespace gyre
