// The trellis LDLQ on the GPU (the agreed algorithm of quant/gptq_trellis.h, whose CPU code is
// the reference): internals of the quantizer's CUDA files, used by gptq_cuda.cu's Engine.
#pragma once
#include "quant/cuda/gptq_cuda_common.h"

namespace gyre::quant::cuda {

// Most candidates one sweep stacks (every K of three weights), and most runs of consecutive
// candidates with one K (one encoder launch and side stream each).
constexpr int kMaxTrellisStack = 24;
constexpr int kMaxTrellisRuns = 8;

struct TrellisLdlqBuffers {
  TrellisLdlqBuffers() = default;
  TrellisLdlqBuffers(const TrellisLdlqBuffers&) = delete;
  TrellisLdlqBuffers& operator=(const TrellisLdlqBuffers&) = delete;
  ~TrellisLdlqBuffers();
  DevBuf err, target, tile_scale, tile_words, workspace[kMaxTrellisRuns];
  // Made on first use by a stacked sweep: the runs' encoders run concurrently on these.
  cudaStream_t side[kMaxTrellisRuns] = {};
  cudaEvent_t fork = nullptr, join[kMaxTrellisRuns] = {};
};

// LDLQ of w (column-major [cands * rows x n] doubles in the natural column order, dead columns
// zeroed; updated in place): candidate c owns rows [c * rows, (c + 1) * rows) and runs at K =
// ks[c] bits; u (row-major [n x n]) is the upper factor of inverse(H), natural order; scale
// groups of `group` columns (32, 64 or 128), rows and n multiples of 16. The candidates are
// independent sweeps sharing each step's launches (a 256-row sample alone fills 16 of the GPU's
// SMs), with the results of separate calls; consecutive candidates of one K share an encoder
// launch (at most kMaxTrellisRuns runs). Writes dequant (column-major [cands * rows x n],
// scale * code), scale ([n / group x cands * rows]: group g of stacked row r at
// g * cands * rows + r, f16 values as floats) and words (per candidate, one after another,
// [rows / 16][n / 16][8 ks[c]], the layout of QuantizedWeight::trellis); sets *bad (device) when
// a scale overflows f16. Asynchronous.
void trellis_ldlq_device(cublasHandle_t blas, cudaStream_t s, double* w, int64_t rows, int cands,
                         const int* ks, int n, const double* u, int group, double scale_fit,
                         float* dequant, float* scale, uint32_t* words, int* bad,
                         TrellisLdlqBuffers& bufs);

}  // namespace gyre::quant::cuda
