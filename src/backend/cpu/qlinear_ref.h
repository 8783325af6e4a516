// Gyre's group-quantized linear weight layout (host side): packing from floats (round to
// nearest) and exact repacking of GGUF blocks, plus a float reference dequantizer. The CUDA
// kernels (backend/cuda/qlinear.h) read exactly these bytes; this file has no CUDA dependency.
//
// Layout of a weight W [rows, cols] (a linear layer's [out, in]):
//   qweight: row-major; each row is cols/C chunks of 16 bytes, C = 32 (4-bit) or 16 (8-bit), so
//            one 16-byte load yields one chunk and a warp reads 512 contiguous bytes of a row.
//            4-bit: a chunk is 4 little-endian u32 words of 8 columns each; in word i, column
//            8i+2k sits at bits 4k..4k+3 and column 8i+2k+1 at bits 16+4k..19+4k (k = 0..3), so
//            (word >> 4k) & 0x000F000F holds the adjacent pair (2k, 2k+1) in the two 16-bit
//            halves (the input of the 0x6400 magic-number int->half conversion).
//            8-bit: bytes in column order.
//            2/3/5/6-bit: see "Narrow widths" below (no 16-byte chunks; row bytes = cols*bits/8).
//   scales:  [rows, cols/group] of f16 (or f32 when scale_f32: exact K-quant repacks).
//   mins:    same shape, only when asymmetric.
//   perm:    optional [cols] int32 (act-order): packed column j holds W[:, perm[j]], so
//            y = W x = Wp x[perm].
// Element value, with q the unsigned stored integer:
//   symmetric:  w = s * (q - 2^(bits-1))       (Q4_0: offset 8; Q8_0/Q6_K: offset 128)
//   asymmetric: w = s * q + m                  (Q4_1; Q4_K/Q5_K with m = -dmin*min)
// Both are computed in float exactly as GGUF's dequantization does, so repacks are bit-exact.
//
// Narrow widths (2, 3, 5, 6 bits; groups of 32..256; written by `gyre convert`): each value is
// split into a low part of L = 4 (5/6-bit) or 2 (2/3-bit) bits and a high part of H = bits - L
// (0, 1 or 2) bits, and a row is a sequence of units of 32 columns = exactly `bits` u32 words:
// L words of the low plane, then H words of the high plane. In a plane of p bits per value a
// word holds 32/p columns; its column e sits at bit (e % 2) * 16 + p * (e / 2), so
// (word >> p*k) & mask selects the adjacent pair (2k, 2k+1) in the two 16-bit halves: the GPU
// ORs the high pair (shifted by L) into the low pair and converts both columns at once with the
// 0x6400 magic number, as the 4-bit kernels do. Why planes and not a plain bit stream: a 3/5/6-bit
// value in a bit stream straddles word boundaries (a funnel shift per value); split planes
// keep every extraction a shift and a mask of one register, and the 4-bit low plane of 5/6 bits
// is bit-for-bit the 4-bit chunk word above.
// Units are grouped in tiles of 32 units (1024 columns; a row's last tile may be shorter, m
// units): word j of unit u of a tile sits at word 32*bits*tile + j*m + u (m = 32 for full
// tiles). A warp whose lane u reads word j of unit u thus reads contiguous bytes, and no padding
// is needed for any cols that is a multiple of 32.
//
// Trellis-coded weights (desc.trellis; `gyre convert --trellis`): bits = K per weight, the
// 16 x 16 tiles and bit streams of backend/cpu/trellis.h (qweight_bytes() = rows * cols * K / 8,
// tile-row major), symmetric f16 scales per row and group (a multiple of 16), no perm; the value
// is scale * code(state) (no offset, no min).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu/hadamard.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace gyre {

struct QWeightDesc {
  int bits = 4;        // 2, 3, 4, 5, 6 or 8
  int group_size = 0;  // 4-bit (and 2/3/5/6): 32, 64, 128, 256; 8-bit: also 16
  bool asymmetric = false;
  bool scale_f32 = false;  // scales (and mins) are f32 instead of f16
  bool has_perm = false;
  bool trellis = false;  // trellis-coded (see above): rows and cols multiples of 16
  int rows = 0, cols = 0;

  // Columns per 16-byte chunk (4/8-bit) or per unit of `bits` words (narrow widths).
  int chunk_cols() const { return bits == 8 ? 16 : 32; }
  bool narrow() const { return !trellis && bits != 4 && bits != 8; }  // the split-plane layout
  int64_t groups_per_row() const { return cols / group_size; }
  int64_t qweight_bytes() const { return int64_t{rows} * cols * bits / 8; }
  int64_t scale_count() const { return int64_t{rows} * groups_per_row(); }
  int scale_bytes() const { return scale_f32 ? 4 : 2; }
  // Stored bits per weight, scales and mins included.
  double bits_per_weight() const {
    return bits + 8.0 * scale_bytes() * (asymmetric ? 2 : 1) / group_size;
  }
};

// Throws unless the description is one the kernels support.
void qweight_validate(const QWeightDesc& d);

struct QWeightHost {
  QWeightDesc desc;
  std::vector<uint8_t> qweight;  // desc.qweight_bytes()
  std::vector<uint8_t> scales;   // scale_count() * scale_bytes(), little-endian
  std::vector<uint8_t> mins;     // same, or empty when symmetric
  std::vector<int32_t> perm;     // cols, or empty
  // A rotated layer (backend/cpu/hadamard.h): the packed values are quant(W R) and the layer
  // computes y = (W R)_q (R^T x); the backends rotate x (CUDA) or fold R^T into their dequantized
  // floats (the CPU, through qweight_dequantize_row).
  HadamardRotation had;

  int q(int64_t r, int64_t packed_col) const;  // the stored unsigned integer (not trellis)
  float scale(int64_t r, int64_t group) const;
  float min(int64_t r, int64_t group) const;
};

// Round-to-nearest quantization of w [rows, cols] (row-major floats). Symmetric:
// s = max|w| / (2^(bits-1) - 1) per group; asymmetric: s = (max - min) / (2^bits - 1), m = min;
// s and m are rounded to f16 first and q = clamp(round(...)) uses the rounded values.
// perm (cols entries, a permutation) packs column j from w[:, perm[j]]; nullptr for none.
QWeightHost qweight_pack_from_f32(const float* w, int rows, int cols, int bits, int group_size,
                                  bool asymmetric, const int32_t* perm = nullptr);

// Exact repack of GGUF blocks (rows of dtype_row_bytes(t, cols) bytes, any alignment):
// Q4_0 -> 4-bit g32 sym f16; Q4_1 -> 4-bit g32 asym f16; Q8_0 -> 8-bit g32 sym f16;
// Q4_K -> 4-bit g32 asym f32; Q5_K -> 8-bit g32 asym f32; Q6_K -> 8-bit g16 sym f32.
// Other types throw (callers convert F16/BF16/F32 with qweight_pack_from_f32 or keep FP16).
bool qweight_gguf_supported(DType t);
QWeightHost qweight_pack_from_gguf(DType t, const void* blocks, int rows, int cols);

// Row concatenation [a; b; ...] of weights with one layout (bits, group, symmetry, scale type,
// cols; perms equal when present), e.g. to fuse Q/K/V or gate/up into one GEMV launch: the
// output of the fused matmul is the parts' outputs side by side. Throws on mismatched layouts.
// Trellis weights concatenate too (each part is whole 16-row tile rows).
QWeightHost qweight_concat_rows(const std::vector<const QWeightHost*>& parts);

// Building blocks for loaders of other quantized formats (e.g. GPTQ, model/gptq.cc): a zeroed
// weight of a validated description, and setters for one stored integer (packed column c) and one
// group's scale and min (min ignored when symmetric; rounded to f16 unless scale_f32).
QWeightHost qweight_allocate(const QWeightDesc& d);
void qweight_set_q(QWeightHost& w, int64_t r, int64_t packed_col, int q);
void qweight_set_scale(QWeightHost& w, int64_t r, int64_t group, float scale, float min);

// Rows interleaved in blocks: a's rows [kb, kb + block), then b's, ... with each part's rows
// padded to a multiple of block by zero rows (zero scales and mins: value 0), as fuse_views does
// for fused gate/up weights. a and b must have one layout and shape; trellis weights need a
// block that is a multiple of 16 (whole tile rows).
QWeightHost qweight_interleave_rows(const QWeightHost& a, const QWeightHost& b, int block);
// Row j of the result is row order[j] of w (order: a permutation of the rows). Exact: rows are
// independent (their own scales and mins); not for trellis weights (16-row tiles coded as one).
QWeightHost qweight_permute_rows(const QWeightHost& w, const std::vector<int32_t>& order);
// Whether qweight_concat_rows accepts the two (same bits, group, symmetry, scales, trellis, cols,
// perm, rotation).
bool qweight_same_layout(const QWeightHost& a, const QWeightHost& b);

// A TensorView of dtype QPACKED for w (shape [rows, cols]; w must outlive the view), and the
// weight behind such a view (throws unless v is a consistent QPACKED view).
TensorView qweight_view(const std::string& name, const QWeightHost& w);
const QWeightHost& qweight_of_view(const TensorView& v);

// Row r of W in the original column order (perm undone), computed in float as documented above;
// for a rotated weight, the effective row (W R)_q R^T in the original input space.
void qweight_dequantize_row(const QWeightHost& w, int64_t r, float* out);

}  // namespace gyre
