// Test hook: fills the shared memory of every SM with 0xff bytes (NaN in FP16, NaN in f32) before
// a kernel under test runs. Shared memory keeps what the previous kernel left, and a test that
// runs the same weights twice leaves the right values there, so a kernel that reads a slot before
// its cp.async lands passes anyway (session 25: the staged scale read before its wait was caught
// by the engine's NaN logits, not by the tests); after this, such a read yields NaN.
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/smem_poison.h"

namespace gyre::qlinear_detail {

namespace {

__global__ void poison_shared_kernel(int words) {
  extern __shared__ uint32_t shared_words[];
  volatile uint32_t* s = shared_words;  // stores no later read needs: volatile keeps them
  for (int i = threadIdx.x; i < words; i += blockDim.x) s[i] = 0xffffffffu;
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

}  // namespace gyre::qlinear_detail
