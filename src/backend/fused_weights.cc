// Fused weights: the host assembly (fused_weights.h) and the Backend's default fused ops, which
// run one matmul per part on row slices of the fused weight (the reference semantics).
#include "backend/fused_weights.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "backend/backend.h"
#include "core/error.h"

namespace gyre {

namespace {

void check_parts(const std::vector<TensorView>& parts, int block) {
  GYRE_CHECK(!parts.empty(), "fused weight of no parts");
  for (const TensorView& p : parts) {
    const bool vector = p.shape.size() == 1;  // vectors concatenate whatever their lengths
    GYRE_CHECK(p.dtype == parts[0].dtype && (vector || p.cols() == parts[0].cols()) &&
                   p.shape.size() == parts[0].shape.size() && !p.shape.empty(),
               "cannot fuse ", p.name, " (", dtype_name(p.dtype), " ", shape_str(p.shape),
               ") with ", parts[0].name, " (", dtype_name(parts[0].dtype), " ",
               shape_str(parts[0].shape), ")");
  }
  if (block > 0)
    GYRE_CHECK(parts.size() == 2 && parts[0].shape == parts[1].shape, "cannot interleave ",
               parts[0].name, " ", shape_str(parts[0].shape), " with ", parts.back().name, " ",
               shape_str(parts.back().shape));
}

}  // namespace

std::vector<int64_t> fused_shape(const std::vector<TensorView>& parts, int block) {
  check_parts(parts, block);
  if (parts[0].shape.size() == 1) {  // biases and other vectors: one long vector
    int64_t n = 0;
    for (const TensorView& p : parts) n += p.numel();
    return {n};
  }
  int64_t rows = 0;
  for (const TensorView& p : parts) rows += p.rows();
  if (block > 0) rows = 2 * ((parts[0].rows() + block - 1) / block * block);
  return {rows, parts[0].cols()};
}

TensorView fuse_views(const std::vector<TensorView>& parts, int block,
                      std::vector<uint8_t>& storage) {
  TensorView out;
  out.shape = fused_shape(parts, block);
  out.dtype = parts[0].dtype;
  out.name = parts[0].name;  // backends may decide by name (e.g. which weights to quantize)
  const bool vector = parts[0].shape.size() == 1;
  const int64_t cols = vector ? 1 : parts[0].cols();
  const size_t row_bytes =
      vector ? dtype_row_bytes(out.dtype, 1) : dtype_row_bytes(out.dtype, cols);
  const int64_t rows = out.shape[0];
  storage.assign(static_cast<size_t>(rows) * row_bytes, 0);
  for (const TensorView& p : parts) {
    const int64_t pr = vector ? p.numel() : p.rows();
    GYRE_CHECK(p.data != nullptr && p.nbytes >= static_cast<size_t>(pr) * row_bytes, "weight ",
               p.name, " has no data for its shape");
  }
  auto copy_rows = [&](const TensorView& p, int64_t src_row, int64_t dst_row, int64_t n) {
    std::memcpy(storage.data() + static_cast<size_t>(dst_row) * row_bytes,
                static_cast<const uint8_t*>(p.data) + static_cast<size_t>(src_row) * row_bytes,
                static_cast<size_t>(n) * row_bytes);
  };
  if (block <= 0 || vector) {
    int64_t r = 0;
    for (const TensorView& p : parts) {
      const int64_t pr = vector ? p.numel() : p.rows();
      copy_rows(p, 0, r, pr);
      r += pr;
    }
  } else {
    const int64_t h = parts[0].rows();
    for (int64_t r0 = 0; r0 < h; r0 += block) {
      const int64_t n = std::min<int64_t>(block, h - r0);
      copy_rows(parts[0], r0, 2 * r0, n);
      copy_rows(parts[1], r0, 2 * r0 + block, n);
    }
  }
  out.data = storage.data();
  out.nbytes = storage.size();
  return out;
}

Tensor Backend::upload_fused(const std::vector<TensorView>& parts, FusedKind /*kind*/) {
  auto storage = std::make_shared<std::vector<uint8_t>>();
  Tensor t = upload_weight(fuse_views(parts, 0, *storage));
  // A backend may keep using the host bytes in place (the CPU backend does): the tensor then
  // owns the fused copy too.
  t.owner = std::make_shared<std::pair<std::shared_ptr<void>, std::shared_ptr<void>>>(
      std::move(t.owner), std::move(storage));
  return t;
}

void Backend::matmul_split(const std::vector<Tensor*>& outs, const Tensor& x, const Tensor& w,
                           const Tensor* bias) {
  int64_t r0 = 0;
  for (Tensor* out : outs) {
    GYRE_CHECK(out != nullptr && r0 + out->cols <= w.rows, "matmul_split: outputs of ", r0,
               "+ rows for a fused weight of ", w.rows);
    Tensor part_bias;
    if (bias) {
      GYRE_CHECK(bias->rows * bias->cols == w.rows, "matmul_split: bias size mismatch");
      part_bias = *bias;
      part_bias.data = static_cast<uint8_t*>(bias->data) + dtype_row_bytes(bias->dtype, r0);
      part_bias.rows = 1;
      part_bias.cols = out->cols;
    }
    matmul(*out, x, w.slice_rows(r0, out->cols), bias ? &part_bias : nullptr);
    r0 += out->cols;
  }
  GYRE_CHECK(r0 == w.rows, "matmul_split: outputs cover ", r0, " of ", w.rows, " rows");
}

void Backend::matmul_swiglu(Tensor& out, const Tensor& x, const Tensor& w_gate_up) {
  const int64_t h = out.cols;
  GYRE_CHECK(w_gate_up.rows == 2 * h, "matmul_swiglu: weight of ", w_gate_up.rows,
             " rows for a hidden size of ", h);
  Tensor up = alloc(out.rows, h);
  matmul(out, x, w_gate_up.slice_rows(0, h), nullptr);
  matmul(up, x, w_gate_up.slice_rows(h, h), nullptr);
  silu_mul(out, out, up);
}

}  // namespace gyre
