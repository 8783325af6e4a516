// Fused projections whose parts cannot share one packed layout (EXL2 layers of different widths
// or mixes, GPTQ parts of different perms or widths): the fused weight keeps the parts quantized,
// as groups of adjacent parts that do share a layout (concatenated: e.g. k|v at one width), and
// runs one matmul per group straight into the parts' outputs (the RMSNorm folded into each group
// where its kernel allows). Gate and up are two groups, then one SwiGLU kernel. Before this, such
// parts were dequantized and fused as FP16 (4x the bytes of 4-bit parts to read per token);
// GYRE_CUDA_FUSED_PARTS=0 in the environment keeps that (for comparisons).
#include <cstdlib>
#include <string>
#include <utility>

#include "backend/cpu/qmixed.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_buffers.h"
#include "backend/cuda/qlinear.h"
#include "backend/cuda/qmixed_device.h"

namespace gyre::cuda {

namespace {

// The fused weight's groups; on the Tensor, dtype I16 (never a device weight otherwise) marks it
// and data points here.
struct FusedPartsDevice {
  struct Group {
    Tensor w;       // packed (Q4_0/Q8_0 marker), mixed (QPACKED) or FP16
    int first = 0;  // its first part (output)
    int count = 1;  // parts it computes (<= OutSplit::kMaxParts)
    int row0 = 0;   // its first row in the stacked parts (bias offset)
  };
  std::vector<Group> groups;
  int parts = 0;
  bool gate_up = false;
  // Every group mixed with a decode row (QMixedDevice::row): the rows lie one after the other in
  // `rows`, and one gather (normalising, when the norm is folded in) fills them all at n = 1, so
  // each group's parts read their slices without a gather of their own (parts_rows_input).
  std::shared_ptr<void> rows, row_lists;
  MixedGather rows_gather;
};

const FusedPartsDevice& parts_of(const Tensor& t) {
  return *static_cast<const FusedPartsDevice*>(t.data);
}

bool is_packed_view(const TensorView& v) {
  return v.dtype == DType::QPACKED && !is_qmixed_view(v);
}

// Parts that concatenate into one packed (or one mixed) weight.
bool same_layout(const TensorView& a, const TensorView& b) {
  if (is_packed_view(a) && is_packed_view(b))
    return qweight_same_layout(qweight_of_view(a), qweight_of_view(b));
  if (is_qmixed_view(a) && is_qmixed_view(b))
    return qmixed_same_layout(qmixed_of_view(a), qmixed_of_view(b));
  return false;
}

int part_bits_of(const std::string& name, int bits, int alt_bits) {
  for (const char* p : {"k_proj.", "v_proj.", "up_proj."})
    if (name.find(p) != std::string::npos) return alt_bits;
  return bits;
}

// Lays the groups' decode rows one after the other (FusedPartsDevice::rows) when every group is
// a mixed weight that has one; the groups' QMixedDevice::row then point into it (nothing else
// writes those rows: the engine sees the fused weight, never the groups).
void share_group_rows(FusedPartsDevice& fp) {
  if (fp.groups.size() > static_cast<size_t>(kMixedMaxParts)) return;
  MixedGather g;
  std::vector<int32_t> lists;
  for (const auto& group : fp.groups) {
    if (!is_mixed_tensor(group.w) || qmixed_of(group.w).row == nullptr) return;
    const QMixedDevice& m = qmixed_of(group.w);
    g.k[g.parts] = m.row_cols;
    g.offset[g.parts] = static_cast<int64_t>(lists.size());  // row_cols: a multiple of 64
    ++g.parts;
    lists.resize(lists.size() + static_cast<size_t>(m.row_cols));
    GYRE_CUDA_CHECK(cudaMemcpy(lists.data() + g.offset[g.parts - 1], m.row_list,
                               static_cast<size_t>(m.row_cols) * sizeof(int32_t),
                               cudaMemcpyDeviceToHost));
  }
  fp.rows = device_alloc(lists.size() * sizeof(half), "fused parts' decode rows");
  GYRE_CUDA_CHECK(cudaMemset(fp.rows.get(), 0, lists.size() * sizeof(half)));
  fp.row_lists = device_alloc(lists.size() * sizeof(int32_t), "fused parts' row columns");
  GYRE_CUDA_CHECK(cudaMemcpy(fp.row_lists.get(), lists.data(), lists.size() * sizeof(int32_t),
                             cudaMemcpyHostToDevice));
  for (int i = 0; i < g.parts; ++i)
    const_cast<QMixedDevice&>(qmixed_of(fp.groups[static_cast<size_t>(i)].w)).row =
        static_cast<half*>(fp.rows.get()) + g.offset[i];
  fp.rows_gather = g;
}

}  // namespace

bool fused_parts_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("GYRE_CUDA_FUSED_PARTS");
    return e == nullptr || std::string(e) != "0";
  }();
  return on;
}

bool is_parts_tensor(const Tensor& t) {
  return t.dtype == DType::I16 && t.data != nullptr;
}

Tensor CudaBackend::upload_parts(const std::vector<TensorView>& parts, FusedKind kind) {
  GYRE_CHECK(!parts.empty() && parts.size() <= static_cast<size_t>(OutSplit::kMaxParts),
             "fused weight of ", parts.size(), " parts");
  auto fp = std::make_shared<FusedPartsDevice>();
  fp->gate_up = kind == FusedKind::GateUp;
  fp->parts = static_cast<int>(parts.size());
  const int alt_bits = synthetic_ ? synthetic_part_bits_ : 0;
  auto bits_of = [&](const TensorView& v) {
    return part_bits_of(v.name, options_.weight_bits, alt_bits);
  };
  int row0 = 0;
  for (size_t i = 0; i < parts.size();) {
    GYRE_CHECK(parts[i].shape.size() == 2 && parts[i].cols() == parts[0].cols(),
               "fused weight: part ", parts[i].name, " does not match ", parts[0].name);
    size_t j = i + 1;  // gate and up stay apart (the SwiGLU takes one from each)
    while (!fp->gate_up && j < parts.size() &&
           (synthetic_ ? bits_of(parts[j]) == bits_of(parts[i]) : same_layout(parts[i], parts[j])))
      ++j;
    FusedPartsDevice::Group g;
    g.first = static_cast<int>(i);
    g.count = static_cast<int>(j - i);
    g.row0 = row0;
    std::vector<TensorView> run(parts.begin() + static_cast<long>(i),
                                parts.begin() + static_cast<long>(j));
    if (synthetic_) {  // only shapes matter: one weight of the group's rows at its width
      TensorView v = run[0];
      for (size_t k = 1; k < run.size(); ++k) v.shape[0] += run[k].rows();
      const int saved = options_.weight_bits;
      options_.weight_bits = bits_of(v);
      try {
        g.w = upload_weight(v);
      } catch (...) {
        options_.weight_bits = saved;
        throw;
      }
      options_.weight_bits = saved;
    } else if (run.size() == 1) {
      g.w = upload_weight(run[0]);
    } else if (is_packed_view(run[0])) {
      std::vector<const QWeightHost*> hosts;
      for (const TensorView& p : run) hosts.push_back(&qweight_of_view(p));
      const QWeightHost fused = qweight_concat_rows(hosts);
      g.w = upload_weight(qweight_view(run[0].name, fused));
    } else {
      std::vector<const QMixedHost*> hosts;
      for (const TensorView& p : run) hosts.push_back(&qmixed_of_view(p));
      const QMixedHost fused = qmixed_concat_rows(hosts);
      g.w = upload_weight(qmixed_view(run[0].name, fused));
    }
    row0 += static_cast<int>(g.w.rows);
    fp->groups.push_back(std::move(g));
    i = j;
  }
  share_group_rows(*fp);
  Tensor t;
  t.dtype = DType::I16;
  t.cols = parts[0].cols();
  // Gate/up: the row count of the interleaved weight it stands for (matmul_swiglu's shape check).
  const int64_t hidden = parts[0].rows();
  t.rows = fp->gate_up ? 2 * ((hidden + kSwigluBlock - 1) / kSwigluBlock * kSwigluBlock) : row0;
  t.data = fp.get();
  t.owner = std::move(fp);
  return t;
}

void CudaBackend::group_matmul(const Tensor& w, const half* x, const OutSplit& split, int n,
                               const half* bias, const QlinearFusion& f) {
  const int rows = static_cast<int>(w.rows), in = static_cast<int>(w.cols);
  if (is_quantized_tensor(w) && n < kDequantGemmMinRows && qlinear_runs_direct(qweight_of(w), n)) {
    if (split.parts == 1)
      qlinear_matmul(qweight_of(w), x, split.out[0], n, bias, stream_, f);
    else
      qlinear_matmul_split(qweight_of(w), x, split, n, bias, stream_, f);
    return;
  }
  GYRE_CHECK(f.norm_w == nullptr && !f.accumulate, "internal: no fused norm for this part");
  half* y = split.parts == 1 ? split.out[0] : fused_scratch(static_cast<size_t>(n) * rows);
  if (is_mixed_tensor(w)) {
    mixed_matmul(qmixed_of(w), x, y, n, bias);
  } else if (is_quantized_tensor(w)) {
    packed_part_matmul(qweight_of(w), x, y, n, bias);
  } else {
    const half* xd = x;
    const half* wd = dense_weight(w, xd, n);
    if (n <= kGemvMaxRows) {
      gemv(y, xd, wd, bias, n, rows, in, stream_);
    } else {
      gemm(y, rows, xd, wd, n, rows, in);
      if (bias) add_bias(y, bias, n, rows, stream_);
    }
  }
  if (split.parts > 1) split_rows(split, y, n, rows, stream_);
}

// The groups' decode rows filled by one gather (x normalised by f's norm, if any), or false
// where parts_rows_input does not apply (n > 1, a group without a row, GYRE_CUDA_PARTS_ROWS=0).
bool CudaBackend::parts_rows_input(const Tensor& w, const half* x, int n, const QlinearFusion& f) {
  const FusedPartsDevice& fp = parts_of(w);
  if (n != 1 || fp.rows == nullptr || !parts_rows_enabled_) return false;
  gather_parts(static_cast<half*>(fp.rows.get()), x,
               static_cast<const int32_t*>(fp.row_lists.get()), 1, static_cast<int>(w.cols),
               fp.rows_gather, stream_, f.norm_w, f.norm_eps);
  ++parts_row_gathers_;
  return true;
}

bool CudaBackend::parts_fuse_norms(int n, const Tensor& w) const {
  if (n == 1 && parts_of(w).rows != nullptr && parts_rows_enabled_) return true;  // in the gather
  for (const auto& g : parts_of(w).groups)
    if (!is_quantized_tensor(g.w) || !qlinear_fuses_norm(qweight_of(g.w), n)) return false;
  return true;
}

void CudaBackend::parts_matmul_split(const std::vector<Tensor*>& outs, const Tensor& x,
                                     const Tensor& w, const Tensor* bias, const QlinearFusion& f) {
  const FusedPartsDevice& fp = parts_of(w);
  GYRE_CHECK(!fp.gate_up && outs.size() == static_cast<size_t>(fp.parts),
             "CUDA matmul_split: ", outs.size(), " outputs for a weight of ", fp.parts, " parts");
  GYRE_CHECK(x.dtype == DType::F16 && x.cols == w.cols, "CUDA matmul_split: x of ", x.cols,
             " columns for a weight of ", w.cols);
  const half* b = nullptr;
  if (bias) {
    GYRE_CHECK(bias->dtype == DType::F16 && bias->rows * bias->cols == w.rows,
               "CUDA matmul_split: bias size mismatch");
    b = static_cast<const half*>(bias->data);
  }
  const int n = static_cast<int>(x.rows);
  const bool rows = parts_rows_input(w, static_cast<const half*>(x.data), n, f);
  for (const auto& g : fp.groups) {
    OutSplit s;
    int end = 0;
    for (int k = 0; k < g.count; ++k) {
      const Tensor& o = *outs[static_cast<size_t>(g.first + k)];
      GYRE_CHECK(o.dtype == DType::F16 && o.rows == n, "CUDA matmul_split: bad output ",
                 g.first + k);
      end += static_cast<int>(o.cols);
      s.out[k] = static_cast<half*>(o.data);
      s.end[k] = end;
    }
    s.parts = g.count;
    GYRE_CHECK(end == g.w.rows, "CUDA matmul_split: outputs cover ", end, " of ", g.w.rows,
               " rows of a part");
    const half* gb = b ? b + g.row0 : nullptr;
    if (rows) {  // every kernel after the gather's first reads only rows: all wait late
      const QMixedDevice& m = qmixed_of(g.w);
      mixed_split_in(s, m, mixed_input(m, nullptr, 1, nullptr, 0.0f, nullptr, true), 1, gb,
                     &g != &fp.groups.front());
    } else {
      group_matmul(g.w, static_cast<const half*>(x.data), s, n, gb, f);
    }
  }
}

bool CudaBackend::parts_matmul_swiglu(Tensor& out, const Tensor& x, const Tensor& w,
                                      const QlinearFusion& f, const QMixedDevice* reader) {
  const FusedPartsDevice& fp = parts_of(w);
  const int n = static_cast<int>(x.rows), hidden = static_cast<int>(out.cols);
  GYRE_CHECK(fp.gate_up && fp.groups.size() == 2 && x.dtype == DType::F16 &&
                 out.dtype == DType::F16 && out.rows == n && x.cols == w.cols &&
                 fp.groups[0].w.rows == hidden && fp.groups[1].w.rows == hidden,
             "CUDA matmul_swiglu: x [", n, ", ", x.cols, "] . gate/up parts of [",
             fp.groups[0].w.rows, ", ", w.cols, "] -> out [", out.rows, ", ", out.cols, "]");
  const half* xd = static_cast<const half*>(x.data);
  const bool rows = parts_rows_input(w, xd, n, f);
  auto row_input = [&](const QMixedDevice& m) {  // the group's slice of the rows just gathered
    return mixed_input(m, nullptr, 1, nullptr, 0.0f, nullptr, true);
  };
  if (rows && mixed_prior_epilogue_) {
    // The gate into scratch (or into out, which the reader's row replaces), up's earlier parts'
    // sum after it; up's last part multiplies by silu(gate) in its epilogue (QlinearFusion::gate).
    half* scratch = fused_scratch(2 * static_cast<size_t>(hidden));
    half* gate = reader != nullptr ? static_cast<half*>(out.data) : scratch;
    const QMixedDevice& mg = qmixed_of(fp.groups[0].w);
    const QMixedDevice& mu = qmixed_of(fp.groups[1].w);
    mixed_parts(mg, row_input(mg), gate, 1, 0, mg.n_parts, nullptr, false);
    const MixedInput in = row_input(mu);
    const int last = mu.n_parts - 1, p = part_at(mu, last, 1);
    mixed_parts(mu, in, scratch + hidden, 1, 0, last, nullptr, false, nullptr, nullptr, true);
    QlinearFusion g = part_fusion(in, p);
    g.prior = last > 0 ? scratch + hidden : nullptr;
    g.gate = gate;
    g.x_ready = mixed_late_wait_;
    if (reader != nullptr) g.y_index = reader->pos;
    qlinear_matmul(mu.parts[p], in.x[p],
                   reader != nullptr ? reader->row : static_cast<half*>(out.data), 1, nullptr,
                   stream_, g);
    return reader != nullptr;
  }
  half* gate = static_cast<half*>(out.data);
  half* up = fused_scratch(static_cast<size_t>(n) * hidden);
  if (rows) {
    for (int i = 0; i < 2; ++i) {
      const QMixedDevice& m = qmixed_of(fp.groups[static_cast<size_t>(i)].w);
      mixed_parts(m, row_input(m), i == 0 ? gate : up, 1, 0, m.n_parts, nullptr, false, nullptr,
                  nullptr, i > 0);
    }
  } else {
    group_matmul(fp.groups[0].w, xd, OutSplit::plain(gate, hidden), n, nullptr, f);
    group_matmul(fp.groups[1].w, xd, OutSplit::plain(up, hidden), n, nullptr, f);
  }
  // cuda::silu_mul (the member takes Tensors) is elementwise: in place is fine.
  cuda::silu_mul(gate, gate, up, static_cast<int64_t>(n) * hidden, stream_);
  return false;
}

}  // namespace gyre::cuda

namespace gyre {

void cuda_set_synthetic_part_bits(Backend& backend, int bits) {
  auto* c = dynamic_cast<cuda::CudaBackend*>(&backend);
  GYRE_CHECK(c != nullptr, "backend ", backend.name(), " is not a CUDA backend");
  GYRE_CHECK(bits >= 2 && bits <= 8 && bits != 7, "synthetic part bits must be 2..6 or 8");
  c->set_synthetic_part_bits(bits);
}

}  // namespace gyre
