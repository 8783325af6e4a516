// Mixed-width linear weights on the GPU (backend/cpu/qmixed.h): two packed parts over disjoint
// sets of input columns, each run by the existing qlinear kernels on its gathered input, the
// two products added. On the backend's Tensor the marker is dtype QPACKED (packed 4/8-bit
// weights use Q4_0/Q8_0 markers, so QPACKED is free on the device), data -> QMixedDevice.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/qlinear.h"

namespace gyre {

struct QMixedDevice {
  int rows = 0, cols = 0;
  QWeightDevice hi, lo;
  const int32_t* hi_cols = nullptr;   // [hi.desc.cols] input column of each packed column
  const int32_t* lo_cols = nullptr;   // [lo.desc.cols]
  const int8_t* had_signs = nullptr;  // a rotated layer: x is rotated before the gathers
  int had_block = 0;
};

namespace cuda {

// out [n, k] = x [n, in] columns cols[0..k) (row-major FP16).
void gather_columns(half* out, const half* x, const int32_t* cols, int64_t n, int in, int k,
                    cudaStream_t s);

}  // namespace cuda
}  // namespace gyre
