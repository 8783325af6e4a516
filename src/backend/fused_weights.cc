// Fused weights: the host assembly (fused_weights.h) and the Backend's default fused ops, which
// run one matmul per part on row slices of the fused weight (the reference semantics).
#include "backend/fused_weights.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

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

namespace {

// The default fused weight keeps each part as its own uploaded weight (the CPU backend then
// still reads the mapped file in place); a backend that overrides upload_fused overrides the
// fused matmuls too.
struct FusedParts {
  std::vector<Tensor> parts;
};

const FusedParts& fused_parts(const Tensor& w, const char* op) {
  GYRE_CHECK(w.owner != nullptr && w.data == nullptr, op, ": weight was not made by upload_fused");
  return *static_cast<const FusedParts*>(w.owner.get());
}

}  // namespace

Tensor Backend::upload_fused(const std::vector<TensorView>& parts, FusedKind kind) {
  check_parts(parts, kind == FusedKind::GateUp ? 1 : 0);
  auto fp = std::make_shared<FusedParts>();
  Tensor t;
  for (const TensorView& p : parts) {
    fp->parts.push_back(upload_weight(p));
    t.rows += p.shape.size() == 1 ? p.numel() : p.rows();
  }
  const TensorView& first = parts[0];
  t.dtype = fp->parts[0].dtype;
  if (first.shape.size() == 1) {  // a vector (biases): one row of all the parts
    t.cols = t.rows;
    t.rows = 1;
  } else {
    t.cols = first.cols();
  }
  t.owner = std::move(fp);
  return t;
}

void Backend::rope_qk(Tensor& q, int n_heads, Tensor& k, int n_kv_heads, int head_dim,
                      const int32_t* positions, const RopeTable& table) {
  rope(q, n_heads, head_dim, positions, table);
  rope(k, n_kv_heads, head_dim, positions, table);
}

void Backend::rope_attention(Tensor& out, Tensor& q, Tensor& k, const Tensor& v, KvCache& cache,
                             int layer, int pos0, const AttentionParams& p, const RopeTable& table,
                             const Tensor* /*reader*/) {
  std::vector<int32_t> positions(static_cast<size_t>(std::max<int64_t>(q.rows, 0)));
  std::iota(positions.begin(), positions.end(), pos0);
  rope_qk(q, p.n_heads, k, p.n_kv_heads, p.head_dim, positions.data(), table);
  attention(out, q, k, v, cache, layer, pos0, p);
}

void Backend::matmul_split(const std::vector<Tensor*>& outs, const Tensor& x, const Tensor& w,
                           const Tensor* bias) {
  const FusedParts& parts = fused_parts(w, "matmul_split");
  const FusedParts* biases = bias ? &fused_parts(*bias, "matmul_split (bias)") : nullptr;
  GYRE_CHECK(outs.size() == parts.parts.size() && (!biases || biases->parts.size() == outs.size()),
             "matmul_split: ", outs.size(), " outputs for a weight of ", parts.parts.size(),
             " parts");
  for (size_t i = 0; i < outs.size(); ++i) {
    GYRE_CHECK(outs[i] != nullptr, "matmul_split: missing output");
    matmul(*outs[i], x, parts.parts[i], biases ? &biases->parts[i] : nullptr);
  }
}

void Backend::matmul_swiglu(Tensor& out, const Tensor& x, const Tensor& w_gate_up) {
  const FusedParts& parts = fused_parts(w_gate_up, "matmul_swiglu");
  GYRE_CHECK(parts.parts.size() == 2, "matmul_swiglu: weight of ", parts.parts.size(), " parts");
  Tensor up = alloc(out.rows, out.cols);
  matmul(out, x, parts.parts[0], nullptr);
  matmul(up, x, parts.parts[1], nullptr);
  silu_mul(out, out, up);
}

void Backend::norm_matmul_split(const std::vector<Tensor*>& outs, const NormedInput& in,
                                const Tensor& w, const Tensor* bias) {
  rmsnorm(in.scratch, in.x, in.norm, in.eps);
  matmul_split(outs, in.scratch, w, bias);
}

void Backend::norm_matmul_swiglu(Tensor& out, const NormedInput& in, const Tensor& w_gate_up,
                                 const Tensor* /*reader*/) {
  rmsnorm(in.scratch, in.x, in.norm, in.eps);
  matmul_swiglu(out, in.scratch, w_gate_up);
}

void Backend::matmul_add(Tensor& residual, const Tensor& x, const Tensor& w, Tensor& scratch,
                         const Tensor* /*next*/) {
  matmul(scratch, x, w, nullptr);
  add(residual, scratch);
}

}  // namespace gyre
