// Quantized matmuls (qlinear.h): which kernel runs for a weight at n rows, the fusions' kernel
// parameters, dequantization and act-order gathers. The kernels are in the other qlinear_*.cu
// files (qlinear_internal.h), the uploads in qlinear_upload.cu.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/hadamard_warp.cuh"
#include "backend/cuda/qlinear_internal.h"
#include "core/error.h"

namespace gyre {

using qlinear_detail::layout_params;
using qlinear_detail::Params;

namespace qlinear_detail {
void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA error in ", what, ": ", cudaGetErrorString(e));
}

Params layout_params(const QWeightDevice& w) {
  const QWeightDesc& d = w.desc;
  Params p{};
  p.qweight = w.qweight;
  p.scales = w.scales;
  p.mins = w.mins;
  p.perm = w.perm;
  p.inv_perm = w.inv_perm;
  p.rows = d.rows;
  p.cols = d.cols;
  p.group = d.group_size;
  p.bits = d.bits;
  p.scale_f32 = d.scale_f32;
  p.asym = d.asymmetric;
  p.tiles = (d.rows + 15) / 16;
  p.kblocks = (d.cols + 63) / 64;
  while ((1 << p.group_log2) < d.group_size) ++p.group_log2;
  if (d.trellis) {
    qlinear_detail::trellis_layout_params(d, p);
    return p;
  }
  if (w.narrow_tiled > 0)  // whole pieces (qlinear_stream.cuh)
    p.kblocks = (p.kblocks + w.narrow_tiled - 1) / w.narrow_tiled * w.narrow_tiled;
  p.inplace = w.narrow_tiled > 0 && w.narrow_inplace;
  p.groups_p = p.kblocks * 64 / d.group_size;  // cols / group, plus one pad group at g32
  return p;
}
}  // namespace qlinear_detail

namespace {

using qlinear_detail::check_cuda;

// Weights that every entry point hands to launch_narrow: the narrow widths (tiled or in the host
// layout), tiled 8-bit ones and trellis-coded ones.
bool runs_narrow(const QWeightDevice& w) {
  return w.desc.trellis || w.desc.narrow() || w.narrow_tiled > 0;
}

// 8-bit: the CUDA-core GEMV up to this many rows; the tensor-core batch kernel beyond (measured
// on H100: n = 8 costs 2x n = 1 on CUDA cores, about 1.1x on the batch kernel).
constexpr int kGemv8MaxRows = 4;
int g_rows_per_block = 0;

__global__ void gather_input_kernel(const __half* x, const int32_t* perm, __half* out, int cols,
                                    int64_t total) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t t = i / cols;
  out[i] = x[t * cols + __ldg(perm + (i - t * cols))];
}

// out [n, cols] = x [n, cols] with its columns through perm (out[t][j] = x[t][perm[j]]).
void launch_gather_input(const __half* x, const int32_t* perm, __half* out, int n, int cols,
                         cudaStream_t stream) {
  const int64_t total = int64_t{n} * cols;
  gather_input_kernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(x, perm, out,
                                                                                      cols, total);
}

// The 8-bit decode GEMV loads x per row group: through an act-order permutation that is one
// scattered 2-byte load per value and row group (decode of the Llama-3-8B shape at 8 bits: 257
// tok/s without act-order, 103 with, H100, session 15). Such x is gathered once into g_xperm (a
// fixed device buffer: kernels on one stream run in order) and the GEMV reads it plainly (247).
constexpr int64_t kXpermHalves = int64_t{64} << 14;  // 64 rows of 16384
__device__ __half g_xperm[kXpermHalves];

// p's x gathered through its permutation into g_xperm, which p then reads plainly (when it fits).
void gather_into_xperm(Params& p, cudaStream_t stream) {
  if (p.perm == nullptr || int64_t{p.n} * p.cols > kXpermHalves) return;
  __half* xp = nullptr;
  check_cuda(cudaGetSymbolAddress(reinterpret_cast<void**>(&xp), g_xperm),
             "cudaGetSymbolAddress (act-order input)");
  launch_gather_input(p.x, p.perm, xp, p.n, p.cols, stream);
  p.x = xp;
  p.perm = nullptr;
  p.inv_perm = nullptr;
}

void dispatch_gemv8(Params p, int rows_per_block, cudaStream_t stream) {
  gather_into_xperm(p, stream);
  qlinear_detail::launch_gemv8(p, rows_per_block, stream);
}

Params make_params(const QWeightDevice& w, const __half* x, __half* y, int n, const __half* bias) {
  GYRE_CHECK(w.qweight != nullptr && w.scales != nullptr, "qlinear: weight is not uploaded");
  GYRE_CHECK(n >= 1, "qlinear: batch of ", n, " rows");
  GYRE_CHECK(x != nullptr && y != nullptr, "qlinear: null activation pointer");
  GYRE_CHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0, "qlinear: x must be 16-byte aligned");
  Params p = layout_params(w);
  p.x = x;
  p.y = y;
  p.bias = bias;
  p.n = n;
  return p;
}

}  // namespace

namespace qlinear_detail {
bool gemv4_stream_supported(const Params& p);  // qlinear_gemv_stream.cu
void launch_gemv_stream_pair(const Params& pa, const Params& pb, const QlinearPairRow& row,
                             const Params& epi, cudaStream_t stream);  // qlinear_mixed_stream.cu
}  // namespace qlinear_detail

namespace {
// 2/3/5/6 bits: the kernel of the weight's layout.
// Tokens per pass of the serving-batch kernel on a tiled narrow weight at p.n > 8 tokens: 64, or
// fewer where the plan needs it (its split-K workspace on the LM head); 0 where it cannot run.
Params with_rows(const QWeightDevice& w, int n) {
  Params p = layout_params(w);
  p.n = n;
  return p;
}

int g_bits_batch = -1;  // set_bits_batch

// The fewest rows for the narrow serving-batch kernel (0: never). By default 5: on H100
// (synthetic llama3-8b serving, forward ms per step, bench/NOTES.md session 14) the stream GEMV
// wins at 2 rows (3-bit 2.41 against 2.86), ties at 4 (2.90 / 2.86) and loses at 8 (4.69 / 2.93).
constexpr int kBitsBatchMinRows = 5;
int bits_batch_min_rows() {
  if (g_bits_batch < 0) {
    const char* e = std::getenv("GYRE_CUDA_BITS_BATCH");
    g_bits_batch =
        e != nullptr ? std::clamp(std::atoi(e), 0, kQlinearBatchMaxRows + 1) : kBitsBatchMinRows;
  }
  return g_bits_batch == 0 ? kQlinearBatchMaxRows + 1 : g_bits_batch;
}

// The serving-batch kernel's pieces argument for a tiled narrow or trellis-coded weight; 0 for
// weights it does not read here (the host layout).
int batch_pieces(const QWeightDevice& w) {
  return w.desc.trellis ? qlinear_detail::kBatchTrellis : w.narrow_tiled;
}

int narrow_batch_chunk(const QWeightDevice& w, Params p) {
  if ((w.narrow_tiled == 0 && !w.desc.trellis) || p.n < bits_batch_min_rows()) return 0;
  for (const int chunk : {64, 32, 16}) {
    p.n = std::min(p.n, chunk);
    if (qlinear_detail::batch_stream_supported(p, batch_pieces(w))) return chunk;
  }
  return 0;
}

// 2/3/5/6-bit, tiled 8-bit and trellis-coded weights: the serving-batch kernel where it runs,
// else the GEMV (per 8 tokens beyond 8).
void launch_narrow(const QWeightDevice& w, const Params& p, cudaStream_t stream) {
  if (const int chunk = narrow_batch_chunk(w, p); chunk > 0) {
    GYRE_CHECK(p.gate_in == nullptr, "qlinear: a gated output at the serving-batch kernel");
    for (int t0 = 0; t0 < p.n; t0 += chunk)
      qlinear_detail::launch_batch_stream(token_chunk(p, t0, std::min(chunk, p.n - t0)), stream,
                                          batch_pieces(w));
  } else if (w.desc.trellis) {
    qlinear_detail::launch_gemv_trellis(p, stream);
  } else if (w.narrow_tiled > 0) {
    qlinear_detail::launch_gemv_bits_stream(p, w.narrow_tiled, stream);
  } else {
    qlinear_detail::launch_gemv_bits(p, stream);
  }
}

// The fusions go into the kernel's parameters; the norm only where the stream GEMV runs.
// From 3 rows an act-order weight's x is gathered once into g_xperm and every kernel reads it
// plainly: the register-fed 4-bit GEMV (3..8 rows) and the serving-batch kernels gather per row
// group or per block otherwise (serving 8 requests of the act-order Llama-3-8B shape at 4 bits,
// forward per step: 2.9 ms without act-order, 6.0 with, 3.1 gathered once; H100, session 15).
// Not with a fused norm (its staging gathers the norm weights too) or a rotation.
void gather_act_order_rows(Params& p, cudaStream_t stream) {
  if (p.n >= 3 && p.norm_w == nullptr && p.had_block == 0) gather_into_xperm(p, stream);
}

Params fused_params(const QWeightDevice& w, const __half* x, __half* y, int n, const __half* bias,
                    const QlinearFusion& f, cudaStream_t stream) {
  Params p = make_params(w, x, y, n, bias);
  p.accumulate = f.accumulate;
  GYRE_CHECK(f.y_perm == nullptr || (f.accumulate && f.y_perm_index != nullptr),
             "qlinear: a permuted copy of y needs accumulate and its index");
  p.y_perm = f.y_perm;
  p.y_perm_index = f.y_perm_index;
  GYRE_CHECK(f.prior == nullptr || !f.accumulate, "qlinear: a prior sum does not accumulate");
  p.prior = f.prior;
  GYRE_CHECK(f.y_index == nullptr || n == 1, "qlinear: an indexed SwiGLU output at ", n, " rows");
  p.y_index = f.y_index;
  p.late_wait = f.x_ready && w.perm == nullptr;  // act-order rows may be gathered by a launch
  GYRE_CHECK(f.gate == nullptr || !f.accumulate, "qlinear: a gated output does not accumulate");
  GYRE_CHECK(f.gate == nullptr || n == 1, "qlinear: a gated output at ", n, " rows");
  p.gate_in = f.gate;  // n = 1 runs a decode GEMV (store_out<true>) at every width
  if (f.norm_w != nullptr) {
    GYRE_CHECK(qlinear_fuses_norm(w, n), "qlinear: no fused RMSNorm for a ", w.desc.bits, "-bit [",
               w.desc.rows, ", ", w.desc.cols, "] weight at ", n, " rows");
    p.norm_w = f.norm_w;
    p.norm_eps = f.norm_eps;
  }
  if (f.x_cols > 0) {
    GYRE_CHECK(qlinear_reads_row(w, n, f.x_cols) && f.x_offset % 64 == 0 && f.x_offset >= 0 &&
                   f.x_offset + qlinear_padded_cols(w) <= f.x_cols && f.norm_cols >= 0,
               "qlinear: a ", w.desc.bits, "-bit [", w.desc.rows, ", ", w.desc.cols,
               "] weight cannot read columns ", f.x_offset, ".. of a row of ", f.x_cols, " at ", n,
               " rows");
    p.x_cols = f.x_cols;
    p.x_offset = f.x_offset;
    p.norm_cols = f.norm_cols;
    p.x = x + f.x_offset;  // the kernel stages from here as from a row of its own
    if (p.norm_w != nullptr) p.norm_w += f.x_offset;
  }
  if (qlinear_fuses_rotation(w, n)) {
    p.had_signs = w.had_signs;
    p.had_block = w.had_block;
    p.had_scale = 1.0f / sqrtf(static_cast<float>(w.had_block));  // as hadamard_rotate's
  }
  gather_act_order_rows(p, stream);
  return p;
}
}  // namespace

bool qlinear_fuses_norm(const QWeightDevice& w, int n) {
  if (w.desc.trellis) return false;  // always rotated: the backend normalises and rotates first
  if (w.narrow_tiled > 0)            // the stream GEMV, x staged per pass
    return n >= 1 && n <= 8 && narrow_batch_chunk(w, with_rows(w, n)) == 0;
  if (w.desc.bits != 4 || n < 1 || n > 2) return false;  // where the stream GEMV is the default
  Params p = layout_params(w);
  p.n = n;
  // Any non-null pointer: the fused norm's staging space (act-order weights) counts in the fit.
  p.norm_w = reinterpret_cast<const __half*>(w.qweight);
  return qlinear_detail::gemv4_stream_supported(p);
}

bool qlinear_reads_row(const QWeightDevice& w, int n, int x_cols) {
  // The kernel stages only w's slice, so qlinear_fuses_norm's fit covers it; act-order weights
  // permute x in their staging and rotated ones rotate it, neither of which a slice allows.
  return n == 1 && x_cols > 0 && x_cols % 64 == 0 && w.perm == nullptr && w.had_block == 0 &&
         qlinear_fuses_norm(w, n);
}

bool qlinear_waits_late(const QWeightDevice& w, int n) {
  // Where the stream GEMV runs with a fused norm it runs anyway (the 4-bit default at n <= 2).
  return w.perm == nullptr && w.had_block == 0 && qlinear_fuses_norm(w, n);
}

int qlinear_padded_cols(const QWeightDevice& w) {
  return layout_params(w).kblocks * 64;
}

namespace qlinear_detail {
namespace {
int g_fused_rotation = -1;
}  // namespace

void set_fused_rotation(int mode) {
  GYRE_CHECK(mode >= -1 && mode <= 1, "qlinear: fused rotation mode must be -1, 0 or 1");
  g_fused_rotation = mode;
}

bool fused_rotation_enabled() {
  if (g_fused_rotation < 0) {
    const char* e = std::getenv("GYRE_CUDA_FUSED_ROTATION");
    g_fused_rotation = e != nullptr && std::string(e) == "1" ? 1 : 0;
  }
  return g_fused_rotation == 1;
}
}  // namespace qlinear_detail

bool qlinear_fuses_rotation(const QWeightDevice& w, int n) {
  const int b = w.had_block;
  if (!qlinear_detail::fused_rotation_enabled() || b < 32 || b > cuda::kHadamardWarpMaxBlock ||
      (b & (b - 1)) != 0 || w.desc.cols % b != 0 || w.perm != nullptr ||
      reinterpret_cast<uintptr_t>(w.had_signs) % 16 != 0 || w.had_signs == nullptr)
    return false;
  if (w.narrow_tiled > 0)  // bits_tiled_layout leaves room for the signs
    return n >= 1 && n <= 8 && narrow_batch_chunk(w, with_rows(w, n)) == 0;
  if (w.desc.bits != 4 || n < 1 || n > 2) return false;
  Params p = layout_params(w);
  p.n = n;
  p.had_block = b;  // the signs' and a fused norm's shared memory (norm_w only read as a flag)
  p.norm_w = reinterpret_cast<const __half*>(w.had_signs);
  return qlinear_detail::gemv4_stream_supported(p);
}

void qlinear_gemv(const QWeightDevice& w, const __half* x, __half* y, int n, const __half* bias,
                  cudaStream_t stream, const QlinearFusion& f) {
  GYRE_CHECK(n >= 1 && n <= 8, "qlinear_gemv: n must be 1..8, got ", n);
  const Params p = fused_params(w, x, y, n, bias, f, stream);
  int rpb = g_rows_per_block;
  if (rpb == 0) rpb = 2;
  if (runs_narrow(w)) {
    launch_narrow(w, p, stream);
  } else if (w.desc.bits == 4) {
    qlinear_detail::launch_gemv4(p, stream);
  } else {
    dispatch_gemv8(p, rpb, stream);
  }
  check_cuda(cudaGetLastError(), "qlinear_gemv launch");
}

void qlinear_matmul_split(const QWeightDevice& w, const __half* x, const cuda::OutSplit& outs,
                          int n, const __half* bias, cudaStream_t stream, const QlinearFusion& f) {
  GYRE_CHECK(outs.parts >= 1 && outs.parts <= cuda::OutSplit::kMaxParts &&
                 outs.end[outs.parts - 1] == w.desc.rows,
             "qlinear: split outputs do not cover the weight's ", w.desc.rows, " rows");
  GYRE_CHECK(!f.accumulate && f.gate == nullptr, "qlinear: split outputs do not accumulate");
  Params p = fused_params(w, x, outs.out[0], n, bias, f, stream);
  p.split = outs;
  if (runs_narrow(w)) {
    launch_narrow(w, p, stream);
  } else if (n <= 8 && (w.desc.bits == 4 || n <= kGemv8MaxRows)) {
    if (w.desc.bits == 4) {
      qlinear_detail::launch_gemv4(p, stream);
    } else {
      dispatch_gemv8(p, g_rows_per_block == 0 ? 2 : g_rows_per_block, stream);
    }
  } else if (n <= kQlinearBatchMaxRows && !qlinear_detail::batch_prefers_gemm(p)) {
    qlinear_detail::launch_batch(p, stream);
  } else {
    qlinear_detail::launch_gemm(p, stream);
  }
  check_cuda(cudaGetLastError(), "qlinear split launch");
}

bool qlinear_gemv_swiglu(const QWeightDevice& w, const __half* x, __half* out, int n, int hidden,
                         cudaStream_t stream, const QlinearFusion& f) {
  // 8-bit decode: the CUDA-core GEMV + SwiGLU kernel beats the batch kernel at n <= 4 (28672
  // rows, n = 1: 47 + ~3 us against 72 us on H100).
  if (n < 1 || n > kQlinearBatchMaxRows ||
      (w.desc.bits == 8 && w.narrow_tiled == 0 && n <= kGemv8MaxRows) ||
      (w.desc.narrow() && w.narrow_tiled == 0) ||  // the host layout's kernel has no epilogue
      (runs_narrow(w) && !qlinear_runs_direct(w, n)))
    return false;  // the caller's matmul + SwiGLU
  GYRE_CHECK(!f.accumulate, "qlinear: SwiGLU outputs do not accumulate");
  GYRE_CHECK(w.desc.rows == 2 * ((hidden + 7) / 8 * 8), "qlinear swiglu: weight of ", w.desc.rows,
             " rows for a hidden size of ", hidden);
  Params p = fused_params(w, x, out, n, nullptr, f, stream);
  if (!runs_narrow(w) && qlinear_detail::batch_prefers_gemm(p))
    return false;  // the caller's GEMM + SwiGLU path
  p.swiglu_hidden = hidden;
  if (w.narrow_tiled > 0 || w.desc.trellis) {
    launch_narrow(w, p, stream);
  } else if (w.desc.bits == 4 && n <= 8) {
    qlinear_detail::launch_gemv4(p, stream);
  } else {
    qlinear_detail::launch_batch(p, stream);
  }
  check_cuda(cudaGetLastError(), "qlinear swiglu launch");
  return true;
}

void qlinear_gemv_pair(const QWeightDevice& a, const QWeightDevice& b, const QlinearPairRow& row,
                       __half* y, const __half* bias, cudaStream_t stream, const QlinearFusion& f,
                       const cuda::OutSplit* split, int swiglu_hidden) {
  GYRE_CHECK(qlinear_pair_supported(a, b, row.cols, row.n), "qlinear: no two-part kernel for ",
             a.desc.bits, "- and ", b.desc.bits, "-bit parts at ", row.n, " rows");
  GYRE_CHECK(f.y_index == nullptr || row.n == 1, "qlinear: an indexed SwiGLU output at ", row.n,
             " rows");
  for (int p = 0; p < 2; ++p) {
    const int padded = qlinear_padded_cols(p == 0 ? a : b);
    GYRE_CHECK(row.offset[p] % 64 == 0 && row.offset[p] >= 0 && row.offset[p] + padded <= row.cols,
               "qlinear: a part at column ", row.offset[p], " of a row of ", row.cols);
  }
  GYRE_CHECK(f.norm_w == nullptr && f.x_cols == 0 && f.prior == nullptr && f.gate == nullptr,
             "qlinear: the two-part kernel takes its norm and row from QlinearPairRow");
  GYRE_CHECK(swiglu_hidden == 0 || (split == nullptr && !f.accumulate &&
                                    a.desc.rows == 2 * ((swiglu_hidden + 7) / 8 * 8)),
             "qlinear: a two-part SwiGLU of ", a.desc.rows, " rows for ", swiglu_hidden);
  GYRE_CHECK(split == nullptr ||
                 (!f.accumulate && split->parts >= 1 && split->parts <= cuda::OutSplit::kMaxParts &&
                  split->end[split->parts - 1] == a.desc.rows),
             "qlinear: split outputs do not cover the weight's ", a.desc.rows, " rows");
  Params epi =
      fused_params(a, row.row, split != nullptr ? split->out[0] : y, row.n, bias, f, stream);
  if (split != nullptr) epi.split = *split;
  epi.swiglu_hidden = swiglu_hidden;
  Params pa = layout_params(a), pb = layout_params(b);
  pa.n = pb.n = row.n;
  qlinear_detail::launch_gemv_stream_pair(pa, pb, row, epi, stream);
  check_cuda(cudaGetLastError(), "qlinear pair launch");
}

bool qlinear_runs_direct(const QWeightDevice& w, int n) {
  if (n < 1 || n > kQlinearBatchMaxRows) return false;
  if (!runs_narrow(w) || n <= kQlinearNarrowMaxRows) return true;
  return narrow_batch_chunk(w, with_rows(w, n)) > 0;
}

void qlinear_batch(const QWeightDevice& w, const __half* x, __half* y, int n, const __half* bias,
                   cudaStream_t stream) {
  GYRE_CHECK(n >= 1 && n <= kQlinearBatchMaxRows, "qlinear_batch: n must be 1..",
             kQlinearBatchMaxRows, ", got ", n);
  if (runs_narrow(w)) {
    launch_narrow(w, make_params(w, x, y, n, bias), stream);
  } else {
    qlinear_detail::launch_batch(make_params(w, x, y, n, bias), stream);
  }
  check_cuda(cudaGetLastError(), "qlinear_batch launch");
}

void qlinear_gemm(const QWeightDevice& w, const __half* x, __half* y, int n, const __half* bias,
                  cudaStream_t stream) {
  if (runs_narrow(w)) {
    launch_narrow(w, make_params(w, x, y, n, bias), stream);
  } else {
    qlinear_detail::launch_gemm(make_params(w, x, y, n, bias), stream);
  }
  check_cuda(cudaGetLastError(), "qlinear_gemm launch");
}

void qlinear_matmul(const QWeightDevice& w, const __half* x, __half* y, int n, const __half* bias,
                    cudaStream_t stream, const QlinearFusion& f) {
  const Params p = fused_params(w, x, y, n, bias, f, stream);
  if (runs_narrow(w)) {
    launch_narrow(w, p, stream);
    check_cuda(cudaGetLastError(), "qlinear narrow launch");
  } else if (n <= 8 && (w.desc.bits == 4 || n <= kGemv8MaxRows)) {
    qlinear_gemv(w, x, y, n, bias, stream, f);
  } else {
    if (n <= kQlinearBatchMaxRows && !qlinear_detail::batch_prefers_gemm(p)) {
      qlinear_detail::launch_batch(p, stream);
    } else {
      qlinear_detail::launch_gemm(p, stream);
    }
    check_cuda(cudaGetLastError(), "qlinear matmul launch");
  }
}

void qlinear_dequantize(const QWeightDevice& w, __half* out, cudaStream_t stream,
                        bool stored_order) {
  GYRE_CHECK(w.qweight != nullptr && out != nullptr, "qlinear_dequantize: null pointer");
  GYRE_CHECK(reinterpret_cast<uintptr_t>(out) % 16 == 0,
             "qlinear_dequantize: out must be 16-byte aligned");
  Params p = layout_params(w);
  if (stored_order) p.perm = nullptr;  // every dequantizer writes stored order without one
  if (w.desc.trellis) {
    qlinear_detail::launch_dequant_trellis(p, out, stream);
  } else if (w.narrow_tiled > 0) {
    qlinear_detail::launch_dequant_bits_tiled(p, w.narrow_tiled, out, stream);
  } else if (w.desc.narrow()) {
    qlinear_detail::launch_dequant_bits(p, out, stream);
  } else if (w.desc.bits == 4) {
    qlinear_detail::launch_dequant4(p, out, stream);
  } else {
    qlinear_detail::launch_dequant8(p, out, stream);
  }
  check_cuda(cudaGetLastError(), "qlinear_dequantize launch");
}

void qlinear_gather_input(const QWeightDevice& w, const __half* x, __half* out, int n,
                          cudaStream_t stream) {
  GYRE_CHECK(w.perm != nullptr, "qlinear_gather_input: the weight has no column permutation");
  GYRE_CHECK(n >= 1 && x != nullptr && out != nullptr, "qlinear_gather_input: bad arguments");
  launch_gather_input(x, w.perm, out, n, w.desc.cols, stream);
  check_cuda(cudaGetLastError(), "qlinear_gather_input launch");
}

namespace qlinear_detail {
bool qlinear_pdl() {
  static const bool on = [] {
    const char* e = std::getenv("GYRE_QLINEAR_PDL");
    return e == nullptr || std::string(e) != "0";
  }();
  return on;
}

void set_bits_batch(int min_rows) {
  GYRE_CHECK(min_rows >= -1 && min_rows <= kQlinearBatchMaxRows + 1,
             "qlinear: the narrow batch kernel's fewest rows must be -1..",
             kQlinearBatchMaxRows + 1);
  g_bits_batch = min_rows;
}

void set_gemv_rows_per_block(int rows) {
  GYRE_CHECK(rows == 0 || rows == 1 || rows == 2 || rows == 4,
             "qlinear: rows per block must be 0, 1, 2 or 4");
  g_rows_per_block = rows;
}
}  // namespace qlinear_detail

}  // namespace gyre
