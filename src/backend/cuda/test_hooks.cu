// Test hooks. Shared memory keeps what the previous kernel left, and a test that runs the same
// weights twice leaves the right values there, so a kernel that reads a slot before its cp.async
// lands can pass; poison_shared_memory turns such a read into NaN. And a test's kernel starts on
// an idle GPU, where its copies land before it gets far; launch_memory_hog keeps DRAM busy
// beside it (session 25: a staged-scale read before its cp.async wait gave NaN logits in the
// engine while every GEMV test passed, with the poison too).
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/test_hooks.h"

namespace gyre::qlinear_detail {

namespace {

__global__ void poison_shared_kernel(int words) {
  extern __shared__ uint32_t shared_words[];
  volatile uint32_t* s = shared_words;  // stores no later read needs: volatile keeps them
  for (int i = threadIdx.x; i < words; i += blockDim.x) s[i] = 0xffffffffu;
}

__global__ void __launch_bounds__(256)
    memory_hog_kernel(const uint4* buf, size_t n, int passes, unsigned* sink) {
  unsigned acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (int p = 0; p < passes; ++p) {
    size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {  // four 16-byte loads in flight per thread
      const uint4 a = buf[i], b = buf[i + stride], c = buf[i + 2 * stride], d = buf[i + 3 * stride];
      acc ^= a.x ^ b.y ^ c.z ^ d.w;
    }
    for (; i < n; i += stride) acc ^= buf[i].x;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // almost never stored; the loads cannot be dropped
}

}  // namespace

void poison_shared_memory() {
  int dev = 0, optin = 0, sms = 0;
  GYRE_CUDA_CHECK(cudaGetDevice(&dev));
  GYRE_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  GYRE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  GYRE_CUDA_CHECK(cudaFuncSetAttribute(poison_shared_kernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
  // One block fills an SM's shared memory; twice as many blocks as SMs reach each SM.
  poison_shared_kernel<<<2 * sms, 1024, optin>>>(optin / 4);
  GYRE_CUDA_LAUNCHED();
}

void launch_memory_hog(const void* buf, size_t bytes, int passes, unsigned* sink,
                       cudaStream_t stream) {
  int dev = 0, sms = 0;
  GYRE_CUDA_CHECK(cudaGetDevice(&dev));
  GYRE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  memory_hog_kernel<<<sms, 256, 0, stream>>>(static_cast<const uint4*>(buf), bytes / 16, passes,
                                             sink);
  GYRE_CUDA_LAUNCHED();
}

}  // namespace gyre::qlinear_detail
