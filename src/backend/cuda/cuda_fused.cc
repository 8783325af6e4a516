// Fused projections of the CUDA backend: Q|K|V in one weight whose GEMV writes the three outputs
// (OutSplit epilogue), gate/up in one weight interleaved by 8 rows whose GEMV applies SwiGLU
// before storing (FP16 and 4-bit). Paths without such an epilogue (8-bit GEMV, prefill GEMMs)
// compute the fused output into a scratch buffer and finish with one elementwise kernel.
#include <algorithm>

#include "backend/cpu/qmixed.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_buffers.h"
#include "backend/cuda/qlinear.h"
#include "backend/cuda/qmixed_device.h"
#include "backend/fused_weights.h"

namespace gyre::cuda {

namespace {

void check_f16(const Tensor& t, const char* what) {
  GYRE_CHECK(t.dtype == DType::F16 && t.data != nullptr, "CUDA ", what,
             ": expected an FP16 device tensor");
}

int swiglu_rows(int64_t hidden) {
  return static_cast<int>(2 * ((hidden + kSwigluBlock - 1) / kSwigluBlock * kSwigluBlock));
}

}  // namespace

namespace {

// Parts that cannot fuse in one packed layout, with the parts path off (GYRE_CUDA_FUSED_PARTS=0,
// for comparisons): their float rows (`floats` keeps them alive) as F32 views in `dense`, which
// the caller fuses as FP16.
std::vector<TensorView> dense_parts(const std::vector<TensorView>& parts,
                                    std::vector<std::vector<float>>& floats) {
  std::vector<TensorView> dense;
  floats.resize(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].dtype != DType::QPACKED) {
      dense.push_back(parts[i]);
      continue;
    }
    const int64_t rows = parts[i].rows(), cols = parts[i].cols();
    floats[i].resize(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      if (is_qmixed_view(parts[i]))
        qmixed_dequantize_row(qmixed_of_view(parts[i]), r, floats[i].data() + r * cols);
      else
        qweight_dequantize_row(qweight_of_view(parts[i]), r, floats[i].data() + r * cols);
    }
    dense.push_back(f32_view(parts[i].name, floats[i], parts[i].shape));
  }
  return dense;
}

// Packed parts (GPTQ) fuse in the packed layout when they share it (same width, group and perm:
// q/k/v and gate/up of act-order checkpoints usually do, having one input); mixed parts when
// they split their columns alike. Returns false (nothing uploaded) otherwise.
bool fuse_one_layout(const std::vector<TensorView>& parts, int block, QWeightHost& packed,
                     QMixedHost& mixed, TensorView& fused) {
  if (block != 0 && parts.size() != 2) return false;
  bool all_packed = true, all_mixed = true;
  for (const TensorView& p : parts) {
    all_mixed = all_mixed && is_qmixed_view(p);
    all_packed = all_packed && p.dtype == DType::QPACKED && !is_qmixed_view(p);
  }
  if (all_packed) {
    std::vector<const QWeightHost*> hosts;
    for (const TensorView& p : parts) hosts.push_back(&qweight_of_view(p));
    for (const QWeightHost* h : hosts)
      if (!qweight_same_layout(*hosts[0], *h)) return false;
    packed = block == 0 ? qweight_concat_rows(hosts)
                        : qweight_interleave_rows(*hosts[0], *hosts[1], block);
    fused = qweight_view(parts[0].name, packed);
    return true;
  }
  if (all_mixed) {
    std::vector<const QMixedHost*> hosts;
    for (const TensorView& p : parts) hosts.push_back(&qmixed_of_view(p));
    for (const QMixedHost* h : hosts)
      if (!qmixed_same_layout(*hosts[0], *h)) return false;
    mixed = block == 0 ? qmixed_concat_rows(hosts)
                       : qmixed_interleave_rows(*hosts[0], *hosts[1], block);
    fused = qmixed_view(parts[0].name, mixed);
    return true;
  }
  return false;
}

// Trellis-coded parts (one layout) interleave by whole tiles (kTrellisSwigluBlock).
bool all_trellis(const std::vector<TensorView>& parts) {
  for (const TensorView& p : parts)
    if (p.dtype != DType::QPACKED || is_qmixed_view(p) || !qweight_of_view(p).desc.trellis)
      return false;
  return true;
}

bool any_rotated(const std::vector<TensorView>& parts) {
  for (const TensorView& p : parts) {
    if (p.dtype != DType::QPACKED) continue;
    if (is_qmixed_view(p) ? qmixed_of_view(p).had.active() : qweight_of_view(p).had.active())
      return true;
  }
  return false;
}

}  // namespace

Tensor CudaBackend::upload_fused(const std::vector<TensorView>& parts, FusedKind kind) {
  const int block = kind == FusedKind::GateUp ? kSwigluBlock : 0;
  std::vector<uint8_t> storage;
  bool any_quantized = false;
  for (const TensorView& p : parts) any_quantized = any_quantized || p.dtype == DType::QPACKED;
  if (any_quantized) {
    QWeightHost packed;
    QMixedHost mixed;
    const int packed_block = block != 0 && all_trellis(parts) ? kTrellisSwigluBlock : block;
    if (TensorView v; fuse_one_layout(parts, packed_block, packed, mixed, v))
      return upload_weight(v);
    // The parts path runs each part's kernels without the input rotation (cuda_hadamard.cc), so
    // rotated parts of different layouts (a unit's layers share one setting: not from Gyre's
    // converter) take the FP16 fusion, whose dequantized rows are already unrotated.
    if (fused_parts_enabled() && !any_rotated(parts)) return upload_parts(parts, kind);
    std::vector<std::vector<float>> floats;
    return upload_weight(fuse_views(dense_parts(parts, floats), block, storage));
  }
  if (synthetic_) {
    // Contents are generated on the device: only the shape matters (no host copy of the parts).
    TensorView v;
    v.shape = fused_shape(parts, block);
    v.dtype = parts[0].dtype;
    v.name = parts[0].name;
    v.data = parts[0].data;
    v.nbytes = static_cast<size_t>(v.rows()) * dtype_row_bytes(v.dtype, v.cols());
    const bool two_widths = synthetic_part_bits_ != 0 && options_.weight_bits != 0 &&
                            synthetic_part_bits_ != options_.weight_bits && v.shape.size() == 2;
    if (!two_widths) return upload_weight(v);
    if (fused_parts_enabled()) return upload_parts(parts, kind);
    // As before the parts path: parts of two widths fused as FP16.
    const int saved = options_.weight_bits;
    options_.weight_bits = 0;
    Tensor t = upload_weight(v);
    options_.weight_bits = saved;
    return t;
  }
  return upload_weight(fuse_views(parts, block, storage));
}

half* CudaBackend::fused_scratch(size_t halves) {
  grow(fused_scratch_, halves * sizeof(half), "the fused-projection scratch");
  return fused_scratch_.as<half>();
}

const half* CudaBackend::dense_weight(const Tensor& w, const half*& x, int n) {
  if (!is_quantized_tensor(w)) {
    GYRE_CHECK(w.dtype == DType::F16, "CUDA matmul: weight dtype ", dtype_name(w.dtype),
               " is not supported");
    return static_cast<const half*>(w.data);
  }
  const QWeightDevice& q = qweight_of(w);
  const size_t elems = static_cast<size_t>(w.rows) * w.cols;
  grow(dequant_, elems * sizeof(half), "the dequantized-weight scratch");
  const bool gather = q.perm != nullptr;
  if (gather) {
    const size_t halves = static_cast<size_t>(n) * w.cols;
    grow(gather_, halves * sizeof(half), "the act-order input scratch");
    qlinear_gather_input(q, x, gather_.as<half>(), n, stream_);
    x = gather_.as<const half>();
  }
  qlinear_dequantize(q, dequant_.as<half>(), stream_, gather);
  return dequant_.as<const half>();
}

void CudaBackend::gemm(half* out, int ldo, const half* x, const half* w, int n, int o, int in) {
  // Row-major out[n, o] = x[n, in] . w[o, in]^T is column-major out^T = w^T(op T) . x.
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t st = cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, o, n, in, &alpha, w,
                                         CUDA_R_16F, in, x, CUDA_R_16F, in, &beta, out, CUDA_R_16F,
                                         ldo, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  GYRE_CHECK(st == CUBLAS_STATUS_SUCCESS, "cuBLAS GEMM failed (status ", static_cast<int>(st),
             ") for [", n, ", ", in, "] x [", o, ", ", in, "]");
}

namespace {

// The outputs of a Q|K|V-style weight as the kernels' OutSplit (checked against x and w).
OutSplit split_outputs(const std::vector<Tensor*>& outs, const Tensor& x, const Tensor& w) {
  check_f16(x, "matmul_split");
  GYRE_CHECK(!outs.empty() && outs.size() <= static_cast<size_t>(OutSplit::kMaxParts),
             "CUDA matmul_split: 1..", OutSplit::kMaxParts, " outputs, got ", outs.size());
  GYRE_CHECK(x.cols == w.cols, "CUDA matmul_split: x of ", x.cols, " columns for a weight of ",
             w.cols);
  OutSplit split;
  int end = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    check_f16(*outs[i], "matmul_split");
    GYRE_CHECK(outs[i]->rows == x.rows, "CUDA matmul_split: output of ", outs[i]->rows,
               " rows for ", x.rows, " tokens");
    end += static_cast<int>(outs[i]->cols);
    split.out[i] = static_cast<half*>(outs[i]->data);
    split.end[i] = end;
  }
  split.parts = static_cast<int>(outs.size());
  GYRE_CHECK(end == w.rows, "CUDA matmul_split: outputs cover ", end, " of ", w.rows, " rows");
  return split;
}

const half* split_bias(const Tensor* bias, const Tensor& w) {
  if (bias == nullptr) return nullptr;
  check_f16(*bias, "matmul_split bias");
  GYRE_CHECK(bias->rows * bias->cols == w.rows, "CUDA matmul_split: bias size mismatch");
  return static_cast<const half*>(bias->data);
}

}  // namespace

void CudaBackend::matmul_split(const std::vector<Tensor*>& outs, const Tensor& x, const Tensor& w,
                               const Tensor* bias) {
  if (is_parts_tensor(w)) return parts_matmul_split(outs, x, w, bias, QlinearFusion{});
  const OutSplit split = split_outputs(outs, x, w);
  const int n = static_cast<int>(x.rows), o = static_cast<int>(w.rows),
            in = static_cast<int>(w.cols);
  const half* b = split_bias(bias, w);
  const half* xd = rotated_input(w, static_cast<const half*>(x.data), n);
  if (is_mixed_tensor(w)) return mixed_split(split, xd, w, n, b, nullptr, 0.0f);
  if (is_quantized_tensor(w) && n < kDequantGemmMinRows && qlinear_runs_direct(qweight_of(w), n)) {
    qlinear_matmul_split(qweight_of(w), xd, split, n, b, stream_);
    return;
  }
  const half* wd = dense_weight(w, xd, n);
  if (n <= kGemvMaxRows) {
    gemv_split(split, xd, wd, b, n, o, in, stream_);
    return;
  }
  // Prefill: one GEMM per part on its rows of the weight (each is large enough for cuBLAS).
  int r0 = 0;
  for (int i = 0; i < split.parts; ++i) {
    const int rows = split.end[i] - r0;
    gemm(split.out[i], rows, xd, wd + static_cast<int64_t>(r0) * in, n, rows, in);
    if (b) add_bias(split.out[i], b + r0, n, rows, stream_);
    r0 = split.end[i];
  }
}

void CudaBackend::matmul_swiglu(Tensor& out, const Tensor& x, const Tensor& w_gate_up) {
  if (is_parts_tensor(w_gate_up)) {
    parts_matmul_swiglu(out, x, w_gate_up, QlinearFusion{});
    return;
  }
  check_f16(out, "matmul_swiglu");
  check_f16(x, "matmul_swiglu");
  const int n = static_cast<int>(x.rows), hidden = static_cast<int>(out.cols),
            in = static_cast<int>(x.cols), rows = swiglu_rows(out.cols);
  GYRE_CHECK(out.rows == n && w_gate_up.cols == in && w_gate_up.rows == rows,
             "CUDA matmul_swiglu: x [", n, ", ", in, "] . w [", w_gate_up.rows, ", ",
             w_gate_up.cols, "] -> out [", out.rows, ", ", out.cols, "]");
  half* o = static_cast<half*>(out.data);
  const half* xd = rotated_input(w_gate_up, static_cast<const half*>(x.data), n);
  if (is_mixed_tensor(w_gate_up)) {
    mixed_swiglu(o, xd, w_gate_up, n, hidden, nullptr, 0.0f);
    return;
  }
  const bool trellis = is_quantized_tensor(w_gate_up) && qweight_of(w_gate_up).desc.trellis;
  if (is_quantized_tensor(w_gate_up)) {
    // Decode and serving batches: one pass over the weight with the SwiGLU epilogue (not for
    // trellis weights, whose 16-row interleave that epilogue does not pair).
    if (!trellis && qlinear_gemv_swiglu(qweight_of(w_gate_up), xd, o, n, hidden, stream_)) return;
  } else if (n <= kGemvMaxRows) {
    const half* wd = dense_weight(w_gate_up, xd, n);  // an FP16 weight: xd stays x
    if (gemv_swiglu(o, xd, wd, n, hidden, in, stream_)) return;
  }
  // No fused epilogue for this path: the fused [n, rows] output, then one SwiGLU kernel.
  half* fused = fused_scratch(static_cast<size_t>(n) * rows);
  if (is_quantized_tensor(w_gate_up) && n < kDequantGemmMinRows &&
      qlinear_runs_direct(qweight_of(w_gate_up), n)) {
    qlinear_matmul(qweight_of(w_gate_up), xd, fused, n, nullptr, stream_);
  } else {
    const half* wd = dense_weight(w_gate_up, xd, n);
    if (n <= kGemvMaxRows)
      gemv(fused, xd, wd, nullptr, n, rows, in, stream_);
    else
      gemm(fused, rows, xd, wd, n, rows, in);
  }
  swiglu_interleaved(o, fused, n, hidden, rows, trellis ? kTrellisSwigluBlock : kSwigluBlock,
                     stream_);
}

// The decode fusions (Backend::fuses_norms): quantized weights whose decode GEMV stages x in
// shared memory (4-bit at n <= 2, tiled 2/3/5/6-bit at n <= 8) normalise it there, and every
// quantized matmul can add into its output.
bool CudaBackend::fuses_norms(int n, const Tensor& w) const {
  if (is_parts_tensor(w)) return parts_fuse_norms(n, w);
  if (is_mixed_tensor(w)) return mixed_fuses_norm(w);  // in the gather of its parts' inputs
  // A rotated weight needs the normalised x rotated before use: fused where the GEMV also
  // rotates in its staging (GYRE_CUDA_FUSED_ROTATION=1), else the separate norm -> rotate ->
  // matmul (cuda_hadamard.cc).
  if (!is_quantized_tensor(w)) return false;
  const QWeightDevice& q = qweight_of(w);
  return qlinear_fuses_norm(q, n) && (q.had_block == 0 || qlinear_fuses_rotation(q, n));
}

void CudaBackend::norm_matmul_split(const std::vector<Tensor*>& outs, const NormedInput& in,
                                    const Tensor& w, const Tensor* bias) {
  if (mixed_fuses_norm(w)) {
    check_f16(in.norm, "norm_matmul_split");
    GYRE_CHECK(in.norm.rows * in.norm.cols == in.x.cols, "CUDA norm_matmul_split: bad norm size");
    const half* row_norm = take_mixed_row(in, w);
    return mixed_split(split_outputs(outs, in.x, w), static_cast<const half*>(in.x.data), w,
                       static_cast<int>(in.x.rows), split_bias(bias, w),
                       static_cast<const half*>(in.norm.data), in.eps, row_norm);
  }
  if (!fuses_norms(static_cast<int>(in.x.rows), w)) {
    permuted_ = {};
    return Backend::norm_matmul_split(outs, in, w, bias);
  }
  check_f16(in.norm, "norm_matmul_split");
  GYRE_CHECK(in.norm.rows * in.norm.cols == in.x.cols, "CUDA norm_matmul_split: bad norm size");
  if (is_parts_tensor(w)) {
    permuted_ = {};
    QlinearFusion f;
    f.norm_w = static_cast<const half*>(in.norm.data);
    f.norm_eps = in.eps;
    return parts_matmul_split(outs, in.x, w, bias, f);
  }
  const OutSplit split = split_outputs(outs, in.x, w);
  const half* b = split_bias(bias, w);
  QlinearFusion f;
  f.norm_w = static_cast<const half*>(in.norm.data);
  f.norm_eps = in.eps;
  QWeightDevice plain;
  const half* xin = static_cast<const half*>(in.x.data);
  const bool permuted = take_permuted(in, w, plain, xin, f.norm_w);
  qlinear_matmul_split(permuted ? plain : qweight_of(w), xin, split, static_cast<int>(in.x.rows), b,
                       stream_, f);
}

void CudaBackend::norm_matmul_swiglu(Tensor& out, const NormedInput& in, const Tensor& w_gate_up,
                                     const Tensor* reader) {
  const int n = static_cast<int>(in.x.rows);
  att_permuted_ = {};
  const QMixedDevice* row = row_reader(reader, out, n);
  // The paths below that fold the norm in themselves (the parts path checks its own).
  const auto check_shapes = [&] {
    check_f16(out, "norm_matmul_swiglu");
    check_f16(in.norm, "norm_matmul_swiglu");
    GYRE_CHECK(out.rows == n && w_gate_up.cols == in.x.cols &&
                   w_gate_up.rows == swiglu_rows(out.cols) &&
                   in.norm.rows * in.norm.cols == in.x.cols,
               "CUDA norm_matmul_swiglu: bad shapes");
  };
  if (mixed_fuses_norm(w_gate_up)) {
    check_shapes();
    const half* row_norm = take_mixed_row(in, w_gate_up);
    if (mixed_swiglu(static_cast<half*>(out.data), static_cast<const half*>(in.x.data), w_gate_up,
                     n, static_cast<int>(out.cols), static_cast<const half*>(in.norm.data), in.eps,
                     row_norm, row))
      att_permuted_ = {out.data, n, row->pos};
    return;
  }
  if (is_parts_tensor(w_gate_up) && fuses_norms(n, w_gate_up)) {
    permuted_ = {};
    check_f16(in.norm, "norm_matmul_swiglu");
    GYRE_CHECK(in.norm.rows * in.norm.cols == in.x.cols, "CUDA norm_matmul_swiglu: bad norm size");
    QlinearFusion f;
    f.norm_w = static_cast<const half*>(in.norm.data);
    f.norm_eps = in.eps;
    if (parts_matmul_swiglu(out, in.x, w_gate_up, f, row)) att_permuted_ = {out.data, n, row->pos};
    return;
  }
  if (fuses_norms(n, w_gate_up)) {
    check_shapes();
    QlinearFusion f;
    f.norm_w = static_cast<const half*>(in.norm.data);
    f.norm_eps = in.eps;
    QWeightDevice plain;
    const half* xin = static_cast<const half*>(in.x.data);
    const bool permuted = take_permuted(in, w_gate_up, plain, xin, f.norm_w);
    if (row != nullptr) f.y_index = row->pos;
    if (qlinear_gemv_swiglu(permuted ? plain : qweight_of(w_gate_up), xin,
                            row != nullptr ? row->row : static_cast<half*>(out.data), n,
                            static_cast<int>(out.cols), stream_, f)) {
      if (row != nullptr) att_permuted_ = {out.data, n, row->pos};
      return;
    }
  }
  permuted_ = {};
  Backend::norm_matmul_swiglu(out, in, w_gate_up);
}

void CudaBackend::matmul_add(Tensor& residual, const Tensor& x, const Tensor& w, Tensor& scratch,
                             const Tensor* next) {
  const int n = static_cast<int>(x.rows);
  permuted_ = {};
  // x as the attention before left it: in w's column order (rope_attention's reader).
  const PermutedCopy in = att_permuted_;
  att_permuted_ = {};
  const bool mixed = is_mixed_tensor(w), direct = adds_directly(w, n);
  const bool x_permuted = in.x != nullptr && in.x == x.data && in.n == n &&
                          (mixed ? qmixed_of(w).pos != nullptr && in.perm == qmixed_of(w).pos
                                 : is_quantized_tensor(w) && in.perm == qweight_of(w).perm);
  if (mixed || direct) {
    check_f16(residual, "matmul_add");
    check_f16(x, "matmul_add");
    GYRE_CHECK(x.cols == w.cols && residual.cols == w.rows && residual.rows == x.rows,
               "CUDA matmul_add: x [", x.rows, ", ", x.cols, "] . w [", w.rows, ", ", w.cols,
               "] -> residual [", residual.rows, ", ", residual.cols, "]");
  }
  const ResidualCopy copy = residual_copy(next, residual, n);
  if (mixed) {  // every part adds its product into the residual
    if (x_permuted) ++permuted_handoffs_;
    if (mixed_matmul(qmixed_of(w), rotated_input(w, static_cast<const half*>(x.data), n),
                     static_cast<half*>(residual.data), n, nullptr, true, nullptr, 0.0f, copy.y,
                     copy.index, x_permuted))
      permuted_ = {residual.data, n, copy.key};
    return;
  }
  if (direct) {
    QlinearFusion f;
    f.accumulate = true;
    f.y_perm = copy.y;
    f.y_perm_index = copy.index;
    QWeightDevice plain;
    if (x_permuted) {  // the weight as if stored without the permutation: x is in that order
      plain = qweight_of(w);
      plain.perm = nullptr;
      plain.inv_perm = nullptr;
      ++permuted_handoffs_;
    }
    qlinear_matmul(x_permuted ? plain : qweight_of(w),
                   rotated_input(w, static_cast<const half*>(x.data), n),
                   static_cast<half*>(residual.data), n, nullptr, stream_, f);
    if (f.y_perm != nullptr) permuted_ = {residual.data, n, copy.key};
    return;
  }
  GYRE_CHECK(!x_permuted, "internal: a permuted attention output outside its matmul_add");
  Backend::matmul_add(residual, x, w, scratch);
}

bool CudaBackend::adds_directly(const Tensor& w, int n) const {
  return is_quantized_tensor(w) && n < kDequantGemmMinRows && qlinear_runs_direct(qweight_of(w), n);
}

}  // namespace gyre::cuda
