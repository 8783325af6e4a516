// The trellis encoder on the GPU: the Viterbi search of quant/trellis_encode.h for many tiles at
// once, the same algorithm (tail-biting in two passes, the same overlap rule, the same lowest-
// index tie-break) so that its decisions match the CPU encoder up to float rounding. C++17 and
// free of CUDA types: g++ code (tests, quant/gptq_device.cc) includes it.
#pragma once
#include <cstdint>

namespace gyre::quant::cuda {

// Host pointers, synchronous (on the current device): t, sc [tiles][256] targets and scales in
// sequence-position order (as trellis_encode_tile takes them); writes words [tiles][8K] and, if
// err is not null, err [tiles] = the squared error of each tile. Throws gyre::Error on bad K.
void trellis_encode_tiles_host(const float* t, const float* sc, int64_t tiles, int k,
                               uint32_t* words, double* err);

// Device pointers, asynchronous on `stream` (a cudaStream_t); `workspace` is grown as needed
// (a DevBuf of gptq_cuda_common.h, passed as void* to keep this header free of CUDA).
void trellis_encode_tiles_device(const float* t, const float* sc, int64_t tiles, int k,
                                 uint32_t* words, double* err, void* workspace, void* stream);

}  // namespace gyre::quant::cuda
