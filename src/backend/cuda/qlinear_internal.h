// Host entry points the qlinear_*.cu files share (namespace qlinear_detail): each kernel family's
// launches, layouts and uploads, defined in the file named beside them. Include from .cu files
// only (qlinear_kernels.cuh holds device code).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/qlinear.h"
#include "backend/cuda/qlinear_kernels.cuh"

namespace gyre::qlinear_detail {

void launch_gemm(const Params& p, cudaStream_t stream);  // qlinear_gemm.cu
// qlinear_tiled.cu: the 4-bit tiled layout.
void tile_int4_upload(const uint8_t* host_q, const uint8_t* host_scales, const uint8_t* host_mins,
                      const Params& p, uint8_t* dst_q, uint8_t* dst_scales, uint8_t* dst_mins);
void launch_gemv4(const Params& p, cudaStream_t stream);
void launch_dequant4(const Params& p, __half* out, cudaStream_t stream);
void launch_batch(const Params& p, cudaStream_t stream);     // qlinear_batch.cu
bool batch_prefers_gemm(const Params& p);                    // qlinear_batch.cu
void prepare_batch4();                                       // qlinear_batch4.cu
void prepare_batch_bulk();                                   // qlinear_batch_bulk.cu
void prepare_batch_stream();                                 // qlinear_batch_stream.cu
bool batch_stream_supported(const Params& p, int pieces_s);  // qlinear_batch_stream.cu
void launch_batch_stream(const Params& p, cudaStream_t stream, int pieces_s);  // same
// qlinear_bits.cu: 2/3/5/6 bits (any n, eight tokens per pass) and their dequantization.
void launch_gemv_bits(const Params& p, cudaStream_t stream);
void launch_dequant_bits(const Params& p, __half* out, cudaStream_t stream);
// qlinear_bits_stream.cu: the same widths in the tiled layout (any n, up to eight per pass).
// bits_tiled_layout: blocks per piece of the tiled layout for a new upload, 0 = the host layout.
int bits_tiled_layout(const QWeightDesc& d);
// bits_inplace_layout: a new tiled 2/3/5/6-bit upload takes the in-place arrangement.
bool bits_inplace_layout(const QWeightDesc& d);
void tile_bits_upload(const QWeightHost& w, const Params& p, int pieces_s, uint8_t* dst_q,
                      uint8_t* dst_scales, uint8_t* dst_mins);
void launch_gemv_bits_stream(const Params& p, int pieces_s, cudaStream_t stream);
void launch_dequant_bits_tiled(const Params& p, int pieces_s, __half* out, cudaStream_t stream);
// qlinear_trellis.cu: trellis-coded weights (desc.trellis), any n (up to 8 tokens per pass).
void trellis_device_sizes(const QWeightDesc& d, size_t& qbytes, size_t& scale_bytes);
void trellis_layout_params(const QWeightDesc& d, Params& p);
void trellis_upload(const QWeightHost& w, uint8_t* dst_q, uint8_t* dst_scales);
void launch_gemv_trellis(const Params& p, cudaStream_t stream);
void launch_dequant_trellis(const Params& p, __half* out, cudaStream_t stream);
// qlinear_gemv8.cu: the CUDA-core GEMV of 8-bit weights (n <= 8; R = rows_per_block: 1, 2 or
// 4 at n = 1) and their dequantization in the original column order.
void launch_gemv8(const Params& p, int rows_per_block, cudaStream_t stream);
void launch_dequant8(const Params& p, __half* out, cudaStream_t stream);
// The device layout's parameters of w (no activations): qlinear.cu.
Params layout_params(const QWeightDevice& w);

}  // namespace gyre::qlinear_detail
