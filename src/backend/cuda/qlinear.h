// Group-quantized linear layers on the GPU: the device side of Gyre's 4/8-bit weight layout
// (documented in backend/cpu/qlinear_ref.h, which also packs and repacks on the host).
//
// All entry points take raw device pointers and a stream so the CUDA backend can wrap them in
// its own Tensor ownership. Activations are FP16, row-major [n, cols] in and [n, rows] out;
// accumulation is in float (8-bit GEMV: per-chunk partial sums of at most 8 products in FP16).
// Invalid arguments throw gyre::Error; CUDA failures throw gyre::Error naming the call.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cpu/qlinear_ref.h"
#include "backend/cuda/out_split.h"

namespace gyre {

// A packed weight in device memory. Views: copying it does not copy the memory.
// 4-bit weights are tiled for the tensor cores at upload (16-row tiles, fragment-ordered nibbles,
// scales per tile: see qlinear_tiled.cu), and so are 2/3/5/6-bit weights (split planes per 16-row
// tile: qlinear_stream.cuh) and 8-bit ones of groups of 32+ (one plane of bytes in the same
// tiles; GYRE_CUDA_BITS8_STREAM=0: the host layout) unless GYRE_CUDA_BITS_STREAM=0, scales are f32
// or cols > kQlinearTiledBitsMaxCols (then the host layout), so only qweight_upload /
// qweight_device_view know the byte layout.
constexpr int kQlinearTiledBitsMaxCols = 16384;
struct QWeightDevice {
  QWeightDesc desc;
  // 2/3/5/6/8 bits: blocks per piece of the tiled layout (1, 2, 4 or 8; 8 bits: 1; set by the
  // view), 0 = the host layout.
  int narrow_tiled = 0;
  // Tiled 2/3/5/6 bits: the in-place word arrangement and its decode (qlinear_inplace.h; set by the
  // view from GYRE_CUDA_BITS_DECODE / set_bits_decode), false = the split planes'.
  bool narrow_inplace = false;
  const uint8_t* qweight = nullptr;  // device layout, 16-byte aligned
  const void* scales = nullptr;      // f16 or f32 (desc.scale_f32), device layout
  const void* mins = nullptr;        // same shape, asymmetric only
  const int32_t* perm = nullptr;     // [cols] or null
  // The inverse permutation (inv_perm[perm[c]] = c), with perm: where each input column goes in
  // the stored order, for the 4-bit decode staging's scatter (qlinear_stream.cuh).
  const int32_t* inv_perm = nullptr;
  void* allocation = nullptr;  // the one cudaMalloc holding all of the above
  // A rotated layer (backend/cpu/hadamard.h): [cols] signs and block B, set by the backend's
  // upload (memory owned there, not by allocation). qlinear_gemv / _matmul / _matmul_split /
  // _gemv_swiglu rotate x themselves where qlinear_fuses_rotation(w, n); everywhere else the
  // caller passes R^T x (hadamard_device.h) and the kernels ignore the signs.
  const int8_t* had_signs = nullptr;
  int had_block = 0;
};

// Device bytes qweight_upload allocates for this layout.
size_t qweight_device_bytes(const QWeightDesc& desc);

// Copies a packed weight to the current device in one allocation (synchronous).
QWeightDevice qweight_upload(const QWeightHost& w);
// The pointers of a weight laid out in caller-owned device memory of qweight_device_bytes(desc)
// bytes (allocation stays null: qweight_free does not free it). For arenas and benchmarks.
QWeightDevice qweight_device_view(const QWeightDesc& desc, void* mem);
void qweight_free(QWeightDevice& w);  // frees and nulls; safe on an empty weight
// Writes an act-order weight's column permutation (cols entries) and its inverse into the weight's
// device memory (synchronous with respect to the host).
void qweight_put_perm(const QWeightDevice& w, const int32_t* perm, cudaStream_t stream);

// Optional fusions of the matmul entry points below: y += x . W (the residual add folded into
// the matmul's output), and x RMS-normalised per token and multiplied by norm_w [cols] before
// use (the RMSNorm folded into its input; only where qlinear_fuses_norm says so: the stream GEMV,
// 4-bit weights at n <= 2 or tiled 2/3/5/6-bit weights at n <= 8).
struct QlinearFusion {
  bool accumulate = false;
  // With accumulate: y_perm [n, rows] receives the new y with row r at column y_perm_index[r]
  // (the inv_perm of the act-order weight that reads y next: y in that weight's column order).
  __half* y_perm = nullptr;
  const int32_t* y_perm_index = nullptr;
  const __half* norm_w = nullptr;
  float norm_eps = 0.f;
  // Not with accumulate: prior [n, rows] (FP16) is added to every output before the split or
  // SwiGLU epilogue (a mixed weight's earlier parts, cuda_qmixed.cc).
  const __half* prior = nullptr;
  // x_cols > 0, only where qlinear_reads_row(w, n, x_cols): each row of x holds x_cols columns
  // (zeros where no column is), normalised over all of them (the mean over norm_cols, norm_w
  // [x_cols] in the same layout), of which this weight reads its qlinear_padded_cols from
  // x_offset (a multiple of 64). A mixed weight's parts reading one decode row laid out for all.
  int x_cols = 0, x_offset = 0, norm_cols = 0;
  // qlinear_gemv_swiglu at n = 1 only: hidden row h goes to out[y_index[h]] (the decode row of
  // the mixed weight that reads it next, cuda_qmixed.cc) instead of out[h].
  const int32_t* y_index = nullptr;
  // x, the norm's row and everything else read before the epilogue were complete before the kernel
  // launched last on the stream started (that kernel: an earlier part of the same mixed weight,
  // whose output only the epilogue reads: prior, or y under accumulate). The stream GEMV then
  // stages and computes before waiting on that kernel (Params::late_wait); not for act-order
  // weights.
  bool x_ready = false;
  // Not with accumulate or split outputs: y row r = silu(gate[r]) * (the product of row r, rounded
  // to FP16), at y_index[r] when that is set (n = 1): the up part of a SwiGLU whose gate is
  // another weight's output [n, rows] (cuda_fused_parts.cc).
  const __half* gate = nullptr;
};
bool qlinear_fuses_norm(const QWeightDevice& w, int n);
// Whether the entry points taking a QlinearFusion accept x_cols at n rows for w (the stream GEMV
// runs: no act-order, no rotation; x_offset must leave room for w's padded columns:
// qlinear_padded_cols).
bool qlinear_reads_row(const QWeightDevice& w, int n, int x_cols);
int qlinear_padded_cols(const QWeightDevice& w);
// Whether w's kernel at n rows stages and computes before waiting on the kernel before when
// QlinearFusion::x_ready says it may (the stream GEMV runs).
bool qlinear_waits_late(const QWeightDevice& w, int n);
// w carries a rotation that the entry points taking a QlinearFusion apply to x in their staging
// (the stream GEMV: where qlinear_fuses_norm holds, no act-order, B = 32..256, 16-byte aligned
// signs, and qlinear_detail::fused_rotation_enabled(), off by default), so that x must NOT be
// rotated by the caller. Fused norms are applied before it.
bool qlinear_fuses_rotation(const QWeightDevice& w, int n);

// y[t, r] = sum_c x[t, c] * W[r, c] (+ bias[r]) for t < n.
// qlinear_gemv: decode, n = 1..8, bandwidth-bound (one pass over the weight; 4-bit on tensor
// cores with float accumulation, so n = 8 costs about what n = 1 does).
// qlinear_batch: serving batches, n = 1..kQlinearBatchMaxRows (tensor cores, one pass over the
// weight per 64 tokens: each weight fragment serves up to 8 n8 token tiles), 4- and 8-bit.
// qlinear_gemm: any n >= 1 (tensor cores, 128x128 tiles); meant for prefill.
// qlinear_matmul: picks one by n and shape as measured on H100 (bench/qlinear_notes.md,
// rounds 3-6): gemv for n <= 8 (8-bit: n <= 4), batch up to 128 (4-bit n = 9..64 mostly the
// stream batch kernel, qlinear_batch_stream.cu), gemm beyond and for n > 64 on the largest
// weights.
// 2/3/5/6 bits: every entry point runs the narrow-width GEMV (tiled: the stream kernel of
// qlinear_bits_stream.cu; host layout: qlinear_bits.cu, eight tokens per pass), except from 5
// rows on tiled in-place weights the serving-batch kernel (set_bits_batch); beyond 8 rows
// without it the GEMV per 8 tokens; callers with a cuBLAS handle should dequantize to FP16 where
// qlinear_runs_direct is false (the CUDA backend does).
// x must be 16-byte aligned; bias may be null.
void qlinear_gemv(const QWeightDevice& w, const __half* x, __half* y, int n, const __half* bias,
                  cudaStream_t stream, const QlinearFusion& f = {});
constexpr int kQlinearBatchMaxRows = 128;
// From this many rows the backend dequantizes a quantized weight for one cuBLAS GEMM instead
// (cuda_ops.cc, cuda_fused.cc, cuda_fused_parts.cc, cuda_qmixed.cc).
constexpr int kDequantGemmMinRows = kQlinearBatchMaxRows + 1;
void qlinear_batch(const QWeightDevice& w, const __half* x, __half* y, int n, const __half* bias,
                   cudaStream_t stream);
void qlinear_gemm(const QWeightDevice& w, const __half* x, __half* y, int n, const __half* bias,
                  cudaStream_t stream);
void qlinear_matmul(const QWeightDevice& w, const __half* x, __half* y, int n, const __half* bias,
                    cudaStream_t stream, const QlinearFusion& f = {});
// Whether qlinear_matmul at n rows beats qlinear_dequantize + an FP16 GEMM: 4/8 bits up to
// kQlinearBatchMaxRows; tiled 2/3/5/6-bit weights (in-place arrangement) up to
// kQlinearBatchMaxRows too (from 5 rows the serving-batch kernel of qlinear_batch_stream.cu, up to
// 64 tokens per pass), else up to kQlinearNarrowMaxRows (one GEMV pass per 8 tokens), as
// trellis-coded ones.
constexpr int kQlinearNarrowMaxRows = 8;
bool qlinear_runs_direct(const QWeightDevice& w, int n);

// qlinear_matmul with the output rows split over up to three tensors (fused Q|K|V).
void qlinear_matmul_split(const QWeightDevice& w, const __half* x, const cuda::OutSplit& outs,
                          int n, const __half* bias, cudaStream_t stream,
                          const QlinearFusion& f = {});
// out [n, hidden] = silu(x . gate) * (x . up) for a gate/up weight interleaved by 8 rows
// (cuda/out_split.h), in one pass over the weight (per 64 tokens): 4-bit or tiled 2/3/5/6-bit
// n <= 8 (GEMV), 4/8-bit n <= kQlinearBatchMaxRows or tiled 2/3/5/6-bit where qlinear_runs_direct
// (batch kernels); false (nothing launched) otherwise.
bool qlinear_gemv_swiglu(const QWeightDevice& w, const __half* x, __half* out, int n, int hidden,
                         cudaStream_t stream, const QlinearFusion& f = {});

// A mixed weight of two widths (cuda_qmixed.cc) at n <= kQlinearPairMaxRows rows laid out as
// its decode row ([n, cols], each token's row whole), in one launch (qlinear_mixed_stream.cu):
// part p reads its padded columns of each row from offset[p] (a multiple of 64); with norm_w
// [cols] (in the row's layout) each row is RMS-normalised first, the mean taken over norm_cols.
// Outputs as qlinear_matmul's (y, f.accumulate, f.y_perm), qlinear_matmul_split's (split) or
// qlinear_gemv_swiglu's (swiglu_hidden > 0, f.y_index at n = 1); the parts' sums meet in float
// before the one rounding. Only where qlinear_pair_supported.
// Up to 2 rows, where the 4-bit stream GEMV runs too: serving a 4/3 mix at 3 and 4 requests
// measured 5-6% slower in one launch than one launch per part (whose 4-bit part then runs the
// register-fed GEMV), at 1 and 2 requests 9% and 14% faster (H100, session 23).
constexpr int kQlinearPairMaxRows = 2;
struct QlinearPairRow {
  const __half* row = nullptr;
  int n = 1;
  int cols = 0;
  int offset[2] = {};
  const __half* norm_w = nullptr;
  float norm_eps = 0.f;
  int norm_cols = 0;
};
bool qlinear_pair_supported(const QWeightDevice& a, const QWeightDevice& b, int row_cols,
                            int n = 1);
void qlinear_gemv_pair(const QWeightDevice& a, const QWeightDevice& b, const QlinearPairRow& row,
                       __half* y, const __half* bias, cudaStream_t stream,
                       const QlinearFusion& f = {}, const cuda::OutSplit* split = nullptr,
                       int swiglu_hidden = 0);

// out [rows, cols] = W in FP16, original column order (perm undone): for prefill through
// cuBLASLt when a scratch buffer is cheaper than the custom GEMM. stored_order: the columns in
// the weight's own (act-order) order instead, every store coalesced; multiply it with
// qlinear_gather_input's x (undoing the order scatters 2-byte stores: ~6x slower prefill).
void qlinear_dequantize(const QWeightDevice& w, __half* out, cudaStream_t stream,
                        bool stored_order = false);
// out [n, cols] = x [n, cols] with its columns in w's stored order (out[t][j] = x[t][perm[j]]);
// w must have a column permutation.
void qlinear_gather_input(const QWeightDevice& w, const __half* x, __half* out, int n,
                          cudaStream_t stream);

namespace qlinear_detail {
// Tuning knob for benchmarks: weight rows per thread block of the GEMV (1, 2 or 4; 0 = auto).
void set_gemv_rows_per_block(int rows);  // 8-bit
// 4-bit GEMV: warps splitting the columns of one 16-row tile (1..16, power of two; 0 = auto)
// and 16-byte loads in flight per lane (2 or 4; 0 = 2).
void set_gemv_ksplit(int ksplit);
void set_gemv_unroll(int unroll);
// 4-bit GEMV kernel: 0 = auto (the stream kernel at n <= 2, the register-fed one beyond),
// 1 = register-fed (qlinear_tiled.cu), 4 = the stream kernel (qlinear_gemv_stream.cu: x in shared
// memory, a register ring of column blocks), whose depth (blocks in flight per warp: 4, 8 or 16;
// 0 = 4) set_gemv_depth sets. (Kernels 2 and 3, shared-memory rings, measured slower on H100
// and were removed in round 5: bench/qlinear_notes.md.) At depth 4, symmetric weights go through
// a cp.async ring in shared memory instead (session 12: +3.5% decode on H100), of
// set_gemv_smem_ring slots per warp (2 or 4; 0: the register ring; -1: GYRE_CUDA_GEMV_SMEM, default
// 4).
void set_gemv_kernel(int kernel);
void set_gemv_depth(int depth);
void set_gemv_smem_ring(int depth);
// The shared-memory ring kernels (4 bits; 5 and 6 bits in place) of symmetric weights: each warp
// stages the scales of its whole piece range once (1), or takes one scale word per piece with its
// ring slot (0); -1: GYRE_CUDA_STREAM_SCALES (staged, the default, or ring).
void set_stream_staged_scales(int mode);
// Batch kernel: warps splitting the columns (1, 2, 4, 8; 0 = auto) and 16-row tiles per warp
// (1 or 2; 0 = auto).
void set_batch_ksplit(int ksplit);
void set_batch_tiles_per_warp(int tiles);
// Batch kernel choice for 4-bit: 0 = auto (by n and shape), 1 = register-fed (qlinear_batch.cu,
// the 8-bit one), 2 = bulk-copy (qlinear_batch_bulk.cu; not for act-order weights), 3 = cp.async
// (qlinear_batch4.cu); batch4's own split-K (1..8, 0 = auto) and tiles per warp; the bulk
// kernel's configuration (1..10: consumer warps / tiles per warp / column blocks per stage
// 8/2/4, 16/1/4, 8/1/8, 8/2/8, 4/2/8 with the weights by bulk copy, 6..10 the same by
// cp.async; 0 = auto), split-K (1, 2, 4, 8; 0 = auto) and producer warps (1..4; 0 = auto).
// 5 = the stream batch kernel (qlinear_batch_stream.cu: x staged in shared memory per K-chunk,
// a register ring of weights; n <= 64, else the automatic choice), 6 = the automatic choice
// without it (the round-5 dispatch, for benchmarks); its tiles per warp (1, 2; 0 = auto),
// K-chunks (0 = auto; raised to the fewest that fit shared memory), warps per block (8, 16;
// 0 = auto) and partition (-1 = auto; -2 = the K-chunk grid; 0 = stream-K over one block per SM
// (two of 8 warps); > 0 = stream-K over that many blocks).
void set_batch_kernel(int kernel);
void set_batch_stream_config(int tiles_per_warp, int ksplit, int warps = 0,
                             int streamk_blocks = -1);
void set_batch4_ksplit(int ksplit);
void set_batch4_tiles_per_warp(int tiles);
void set_batch_bulk_config(int config, int ksplit, int producers = 0);
// 2/3/5/6-bit GEMV (qlinear_bits.cu): weight rows per warp, 2 or 4 (0 = auto: 4 from n = 4).
void set_bits_rows(int rows);
// 2/3/5/6 bits: the tiled layout and stream GEMV (qlinear_bits_stream.cu) for weights viewed or
// uploaded from now on (1), the host layout and qlinear_bits.cu (0), or GYRE_CUDA_BITS_STREAM
// (-1, the default: on unless "0"); the tiled layout's blocks per piece for new weights (1, 2,
// 4, or 8 at 2 bits (4 at the others); 0 = by width) and the stream GEMV's warp budget per SM
// (0 = by width and n).
void set_bits_stream(int mode);
// 8 bits: the tiled layout (in place) and the stream GEMV / serving-batch kernels for weights
// viewed or uploaded from now on (1), the host layout and its kernels (qlinear_gemv8.cu,
// qlinear_batch.cu, qlinear_gemm.cu) (0), or GYRE_CUDA_BITS8_STREAM (-1, the default: on unless
// "0"). Only with set_bits_stream on.
void set_bits8_stream(int mode);
void set_bits_stream_pieces(int pieces);
void set_bits_stream_warps(int budget);
// ... and its tokens per pass (1..8, at most what fits one block per SM; 0 = by shape).
void set_bits_stream_chunk(int tokens);
// Tiled 2/3/5/6 bits: the in-place word arrangement and decode (qlinear_inplace.h) for weights
// viewed or uploaded from now on (1), the split planes' arrangement and decode (0), or
// GYRE_CUDA_BITS_DECODE (-1, the default: new unless "old").
void set_bits_decode(int mode);
// The in-place 3-bit stream GEMV's ring depth at 2 blocks per piece (0: the default, 2; or 4).
void set_bits_stream_depth(int depth);
// The shared-memory ring for symmetric in-place weights of 1 or 2 blocks per piece: -1, the
// default: GYRE_CUDA_BITS_SMEM=0|4, else on; off (0); on (4).
void set_bits_smem_ring(int mode);
// Tiled 2/3/5/6 bits: the fewest rows from which the serving-batch kernel of
// qlinear_batch_stream.cu runs instead of the stream GEMV (2..129; 0: never, so beyond 8 rows the
// GEMV per 8 tokens inside qlinear and FP16 dequantization + cuBLAS in the backend), or
// GYRE_CUDA_BITS_BATCH (-1, the default: that variable's number, else 5).
void set_bits_batch(int min_rows);
// Test hook: the upload's repack of a 2/3/5/6-bit weight into the tiled layout (pieces_s blocks
// per piece, inplace: the in-place arrangement) run on the CPU, as u32 words.
std::vector<uint32_t> tile_bits_on_host(const QWeightHost& w, int pieces_s, bool inplace);
// Rotated layers (qlinear_fuses_rotation): the rotation fused into the stream GEMV's staging (1),
// never (0: the caller's separate rotation everywhere), or GYRE_CUDA_FUSED_ROTATION (-1, the
// default: off unless "1"; fused decode measured 8% slower than the separate warp-shuffle
// kernel on H100, bench/qlinear_notes.md "Session 8: fused rotation"). Callers must not switch
// it between a fuses test and its matmul.
void set_fused_rotation(int mode);
bool fused_rotation_enabled();
// The two-part kernel of mixed weights (qlinear_gemv_pair): on (1), off (0: one launch per part),
// or GYRE_CUDA_MIXED_ONE (-1, the default: on unless "0"); the warps per tile both parts share
// (1..16; 0: GYRE_CUDA_MIXED_TILE_WARPS, else by the plan, which GYRE_CUDA_STREAM_BUDGET and
// GYRE_CUDA_STREAM_WAVE steer as for the one-weight stream GEMV).
void set_mixed_pair(int mode, int tile_warps = 0);
uint64_t qlinear_pair_launches();  // launches of the two-part kernel so far (tests)
// Trellis-coded weights (qlinear_trellis.cu): 64-column pieces in flight per warp of the GEMV
// (2, 4 or 8; 0 = auto: 2 at n <= 2, 4 beyond).
void set_trellis_depth(int depth);
}  // namespace qlinear_detail

}  // namespace gyre
