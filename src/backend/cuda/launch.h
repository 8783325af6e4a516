// Kernel launches with programmatic dependent launch (PDL, sm_90+): the next kernel on the
// stream is scheduled while the current one still runs and waits (pdl_begin) until the current
// one's results are visible. This hides most of the launch gap between the ~450 small kernels
// of a decode step, inside CUDA graphs too. Only for .cu files.
#pragma once
#include <utility>

#include "backend/cuda/cuda_common.h"

namespace gyre::cuda {

// First statement of every kernel launched with launch(): nothing before it may read what an
// earlier kernel writes or write what an earlier kernel reads.
// pdl_begin = pdl_wait, then pdl_launch_dependents; a kernel may let the next one in later
// than its start (the split attention does for long contexts: attention_share.cuh).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_begin() {
  pdl_wait();
  pdl_launch_dependents();
}

bool pdl_supported();  // the current device is sm_90 or newer (elementwise.cu)

template <typename... KernelArgs, typename... Args>
void launch(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
            Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_supported() ? 1 : 0;
  GYRE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// Adds PDL to a launch configuration that already carries other attributes (clusters): `attrs`
// (which cfg.attrs points at) has room for one more.
inline void add_pdl(cudaLaunchConfig_t& cfg, cudaLaunchAttribute* attrs) {
  if (!pdl_supported()) return;
  attrs[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[cfg.numAttrs].val.programmaticStreamSerializationAllowed = 1;
  ++cfg.numAttrs;
}

}  // namespace gyre::cuda
