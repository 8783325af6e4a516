// The trellis LDLQ on the GPU (the agreed algorithm of quant/gptq_trellis.h, whose CPU code is
// the reference): internals of the quantizer's CUDA files, used by gptq_cuda.cu's Engine.
#pragma once
#include "quant/cuda/gptq_cuda_common.h"

namespace gyre::quant::cuda {

struct TrellisLdlqBuffers {
  DevBuf err, target, tile_scale, tile_words, workspace;
};

// LDLQ of w (column-major [rows x n] doubles in the natural column order, dead columns zeroed;
// updated in place) with u (row-major [n x n], the upper factor of inverse(H), natural order) at
// K = k bits, scale groups of `group` columns (32, 64 or 128), rows and n multiples of 16.
// Writes dequant (column-major [rows x n], scale * code), scale ([n / group x rows]: group g of
// row r at g * rows + r, f16 values as floats) and words ([rows / 16][n / 16][8K], the layout of
// QuantizedWeight::trellis); sets *bad (device) when a scale overflows f16. Asynchronous.
void trellis_ldlq_device(cublasHandle_t blas, cudaStream_t s, double* w, int64_t rows, int n,
                         const double* u, int k, int group, double scale_fit, float* dequant,
                         float* scale, uint32_t* words, int* bad, TrellisLdlqBuffers& bufs);

}  // namespace gyre::quant::cuda
