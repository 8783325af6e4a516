// Mixed-width linear weights on the GPU (backend/cpu/qmixed.h): packed parts over disjoint sets
// of input columns, each run by the existing qlinear kernels on its gathered input (one gather
// launch for all parts), the products summed into y by the kernels' accumulate fusion. On the
// backend's Tensor the marker is dtype QPACKED (packed 4/8-bit weights use Q4_0/Q8_0 markers, so
// QPACKED is free on the device), data -> QMixedDevice.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/qlinear.h"

namespace gyre {

constexpr int kMixedMaxParts = 6;  // = kQMixedMaxParts (backend/cpu/qmixed.h); QMixedDevice::order

struct QMixedDevice {
  int rows = 0, cols = 0;
  int n_parts = 0;
  QWeightDevice parts[kMixedMaxParts];
  // Every part's list of input columns (-1: padding, gathered as 0), one after the other.
  const int32_t* cols_all = nullptr;
  const int8_t* had_signs = nullptr;  // a rotated layer: x is rotated before the gathers
  int had_block = 0;
  // One decode row laid out for every part to read, which the kernel before fills in its epilogue
  // so that no gather runs (cuda_fused.cc, cuda_ops.cc); null for a rotated weight. Part p's slot
  // starts at row_offset[p] (its padded columns long); pos [cols]: where input column c lies;
  // row_list [row_cols]: the column at each place (-1: none, always 0 in row). row_norm: every
  // part can also stage the whole row normalised (QlinearFusion::x_cols), as a reader of the
  // residual must.
  half* row = nullptr;
  bool row_norm = false;
  int row_cols = 0;
  int row_offset[kMixedMaxParts] = {};
  const int32_t* pos = nullptr;
  const int32_t* row_list = nullptr;
  // The order the parts run in at one row (decode): parts whose kernel cannot wait late first,
  // then the most bytes first, so that the smaller parts run in the tail of the one before (the
  // kernels after the first stage and compute before waiting on it: QlinearFusion::x_ready).
  // Identity until finish_mixed (cuda_qmixed.cc) sets it.
  int order[kMixedMaxParts] = {0, 1, 2, 3, 4, 5};
};

// Where gather_parts writes: part p's x [n, k[p]] at out + offset[p] (halves).
struct MixedGather {
  int parts = 0;
  int k[kMixedMaxParts] = {};
  int64_t offset[kMixedMaxParts] = {};
};

namespace cuda {

// For each part p: out + g.offset[p], [n, g.k[p]], = the columns of x [n, in] that the part's
// slice of cols_all lists (the parts' slices one after the other; -1 gives 0). One launch. With
// norm_w [in], each row is RMS-normalised first (x / rms(x) * norm_w, as the rmsnorm op).
void gather_parts(half* out, const half* x, const int32_t* cols_all, int64_t n, int in,
                  const MixedGather& g, cudaStream_t s, const half* norm_w = nullptr,
                  float eps = 0.0f);

}  // namespace cuda
}  // namespace gyre
