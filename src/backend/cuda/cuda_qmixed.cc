// Mixed-width linear weights on the CUDA backend (qmixed_device.h): upload, and the matmul as
// the sum of the parts' products, each through qlinear's kernels (decode and batches up to the
// part's direct limit, adding into y) or a dequantized FP16 GEMM/GEMV beyond it, as plain packed
// weights do.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/qmixed.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_buffers.h"
#include "backend/cuda/qmixed_device.h"

namespace gyre::cuda {

namespace {

// Offsets in halves rounded up to 128 (256 bytes): every part of the scratch stays 16-byte
// aligned, as qlinear wants its x.
size_t aligned_halves(size_t h) {
  return (h + 127) / 128 * 128;
}

}  // namespace

bool is_mixed_tensor(const Tensor& t) {
  return t.dtype == DType::QPACKED && t.data != nullptr;
}

const QMixedDevice& qmixed_of(const Tensor& t) {
  return *static_cast<const QMixedDevice*>(t.data);
}

namespace {

static_assert(kMixedMaxParts == kQMixedMaxParts);

// What a mixed weight's Tensor owns: the parts (their own allocations, or views of `memory`),
// the column lists and a rotation's signs.
struct MixedOwner {
  QMixedDevice d;
  std::shared_ptr<void> cols, row, pos, row_list;
  std::shared_ptr<void> signs;
  std::vector<std::shared_ptr<void>> memory;
  MixedOwner() = default;
  MixedOwner(const MixedOwner&) = delete;
  MixedOwner& operator=(const MixedOwner&) = delete;
  ~MixedOwner() {
    for (int p = 0; p < d.n_parts; ++p) qweight_free(d.parts[p]);  // views: allocation is null
  }
};

// The column lists on the device, and the decode row every part reads (QMixedDevice::row): slots
// one after the other, each its part's padded columns long (so 16-byte aligned).
size_t finish_mixed(MixedOwner& o, const std::vector<int32_t>& cols_all) {
  QMixedDevice& d = o.d;
  const size_t list_bytes = cols_all.size() * sizeof(int32_t);
  o.cols = device_alloc(list_bytes, "mixed weight columns");
  GYRE_CUDA_CHECK(cudaMemcpy(o.cols.get(), cols_all.data(), list_bytes, cudaMemcpyHostToDevice));
  d.cols_all = static_cast<const int32_t*>(o.cols.get());
  // Parts whose decode kernel cannot wait late (qlinear_waits_late) go first, then the most bytes.
  auto key = [&](int p) {
    const QWeightDevice& w = d.parts[p];
    return std::make_pair(qlinear_waits_late(w, 1), -int64_t{w.desc.cols} * w.desc.bits);
  };
  std::stable_sort(d.order, d.order + d.n_parts, [&](int a, int b) { return key(a) < key(b); });
  if (d.had_signs != nullptr) return list_bytes;
  int row_cols = 0;
  for (int p = 0; p < d.n_parts; ++p) {
    d.row_offset[p] = row_cols;
    row_cols += qlinear_padded_cols(d.parts[p]);
  }
  d.row_norm = true;
  for (int p = 0; p < d.n_parts; ++p)
    d.row_norm = d.row_norm && qlinear_reads_row(d.parts[p], 1, row_cols);
  std::vector<int32_t> row_list(static_cast<size_t>(row_cols), -1),
      pos(static_cast<size_t>(d.cols), -1);
  size_t at = 0;
  for (int p = 0; p < d.n_parts; ++p) {
    for (int j = 0; j < d.parts[p].desc.cols; ++j, ++at) {
      const int32_t c = cols_all[at];
      if (c < 0) continue;
      row_list[static_cast<size_t>(d.row_offset[p] + j)] = c;
      pos[static_cast<size_t>(c)] = d.row_offset[p] + j;
    }
  }
  for (const int32_t e : pos) GYRE_CHECK(e >= 0, "internal: a mixed weight misses an input column");
  o.row = device_alloc(static_cast<size_t>(row_cols) * sizeof(half), "mixed weight decode row");
  GYRE_CUDA_CHECK(cudaMemset(o.row.get(), 0, static_cast<size_t>(row_cols) * sizeof(half)));
  o.pos = device_alloc(pos.size() * sizeof(int32_t), "mixed weight row places");
  GYRE_CUDA_CHECK(
      cudaMemcpy(o.pos.get(), pos.data(), pos.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  o.row_list = device_alloc(row_list.size() * sizeof(int32_t), "mixed weight row columns");
  GYRE_CUDA_CHECK(cudaMemcpy(o.row_list.get(), row_list.data(), row_list.size() * sizeof(int32_t),
                             cudaMemcpyHostToDevice));
  d.row = static_cast<half*>(o.row.get());
  d.row_cols = row_cols;
  d.pos = static_cast<const int32_t*>(o.pos.get());
  d.row_list = static_cast<const int32_t*>(o.row_list.get());
  return list_bytes + static_cast<size_t>(row_cols) * (sizeof(half) + sizeof(int32_t)) +
         pos.size() * sizeof(int32_t);
}

}  // namespace

Tensor CudaBackend::upload_mixed(const QMixedHost& host) {
  qmixed_validate(host);
  auto o = std::make_shared<MixedOwner>();
  o->d.rows = host.rows;
  o->d.cols = host.cols;
  std::vector<int32_t> cols_all;
  for (const QMixedPart& p : host.parts) {
    o->d.parts[o->d.n_parts++] = qweight_upload(p.w);
    cols_all.insert(cols_all.end(), p.cols.begin(), p.cols.end());
    weight_bytes_ += qweight_device_bytes(p.w.desc);
  }
  if (host.had.active()) {
    o->signs = upload_hadamard_signs(host.had, host.cols);
    o->d.had_signs = static_cast<const int8_t*>(o->signs.get());
    o->d.had_block = host.had.block;
  }
  weight_bytes_ += finish_mixed(*o, cols_all);
  Tensor t;
  t.dtype = DType::QPACKED;
  t.rows = host.rows;
  t.cols = host.cols;
  t.data = &o->d;
  t.owner = std::move(o);
  return t;
}

// GYRE_SYNTHETIC_MIX (cuda_qweights.cc; GYRE_SYNTHETIC_MIX_LAYERS=NAME/NAME picks the weights by
// name, default all but the head): "f16" (the weight as F16, as a layer Gyre could not
// keep quantized loads), or widths "BITS:GROUP:SHARE[:a]/..." (a: asymmetric) in decreasing bits,
// sized as ExLlamaV2's converter sizes a layer's groups (each width ceil(share * cols / GROUP)
// groups, the last width the rest, its last group short and padded here), over shuffled input
// columns.
Tensor CudaBackend::synthetic_mixed(int rows, int cols, const std::string& spec,
                                    const std::string& name) {
  if (spec == "f16") {
    Tensor t = device_tensor(rows, cols, "weight " + name);
    fill_random(static_cast<half*>(t.data), static_cast<int64_t>(rows) * cols, synthetic_seed_++,
                2.0f / std::sqrt(static_cast<float>(cols)), 0.0f, stream_);
    weight_bytes_ += static_cast<size_t>(rows) * cols * sizeof(half);
    return t;
  }
  struct Width {
    int bits, group;
    double share;
    char asym;  // 'a': asymmetric
  };
  std::vector<Width> widths;
  std::string list = spec + ",";  // "/" separates widths too (a comma splits bench arms)
  std::replace(list.begin(), list.end(), '/', ',');
  for (size_t a = 0, b; (b = list.find(',', a)) != std::string::npos; a = b + 1) {
    Width wd{};
    GYRE_CHECK(std::sscanf(list.substr(a, b - a).c_str(), "%d:%d:%lf:%c", &wd.bits, &wd.group,
                           &wd.share, &wd.asym) >= 3 &&
                   wd.share > 0 && (wd.asym == 0 || wd.asym == 'a'),
               "GYRE_SYNTHETIC_MIX: '", list.substr(a, b - a), "' is not BITS:GROUP:SHARE[:a]");
    widths.push_back(wd);
  }
  std::vector<int32_t> order(static_cast<size_t>(cols));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<uint32_t>(synthetic_seed_++)));
  auto o = std::make_shared<MixedOwner>();
  o->d.rows = rows;
  o->d.cols = cols;
  std::vector<int32_t> cols_all;
  int64_t left = cols;
  for (size_t i = 0; i < widths.size() && left > 0; ++i) {
    const Width& wd = widths[i];
    const double want = i + 1 == widths.size() ? static_cast<double>(left)
                                               : std::min<double>(wd.share * cols, left);
    const auto groups = static_cast<int64_t>(std::ceil(want / wd.group));
    const int64_t real = std::min<int64_t>(groups * wd.group, left);
    QWeightDesc d;
    d.bits = wd.bits;
    d.group_size = wd.group;
    d.asymmetric = wd.asym == 'a';
    d.rows = rows;
    d.cols = static_cast<int>(groups * wd.group);
    qweight_validate(d);
    GYRE_CHECK(o->d.n_parts < kMixedMaxParts, "GYRE_SYNTHETIC_MIX: too many widths");
    auto [q, memory] = random_packed(d, "weight " + name);
    o->d.parts[o->d.n_parts++] = *q;
    o->memory.push_back(std::move(memory));
    const size_t at = static_cast<size_t>(cols - left);
    cols_all.insert(cols_all.end(), order.begin() + static_cast<int64_t>(at),
                    order.begin() + static_cast<int64_t>(at + real));
    cols_all.resize(cols_all.size() + static_cast<size_t>(d.cols - real), -1);
    left -= real;
  }
  GYRE_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the parts' random bytes
  weight_bytes_ += finish_mixed(*o, cols_all);
  Tensor t;
  t.dtype = DType::QPACKED;
  t.rows = rows;
  t.cols = cols;
  t.data = &o->d;
  t.owner = std::move(o);
  return t;
}

half* CudaBackend::mixed_scratch(size_t halves) {
  grow(mixed_scratch_, halves * sizeof(half), "the mixed-weight scratch");
  return mixed_scratch_.as<half>();
}

void CudaBackend::packed_part_matmul(const QWeightDevice& w, const half* x, half* y, int n,
                                     const half* bias) {
  if (n < kDequantGemmMinRows && qlinear_runs_direct(w, n)) {
    qlinear_matmul(w, x, y, n, bias, stream_);
    return;
  }
  const int o = w.desc.rows, in = w.desc.cols;
  const size_t elems = static_cast<size_t>(o) * in;
  grow(dequant_, elems * sizeof(half), "the dequantized-weight scratch");
  auto* wd = dequant_.as<half>();
  qlinear_dequantize(w, wd, stream_);
  if (n <= kGemvMaxRows) {
    gemv(y, x, wd, bias, n, o, in, stream_);
    return;
  }
  gemm(y, o, x, wd, n, o, in);
  if (bias) add_bias(y, bias, n, o, stream_);
}

int CudaBackend::part_at(const QMixedDevice& m, int i, int n) const {
  // Batches keep the stored order: serving the 4/3 mix at 8 requests measured 1,783 tok/s in
  // this order against 1,850 stored (H100, session 20), where no kernel waits late.
  return mixed_order_ && n == 1 ? m.order[i] : i;
}

bool CudaBackend::mixed_fuses_norm(const Tensor& w) const {
  return mixed_norm_in_gather_ && is_mixed_tensor(w) && qmixed_of(w).had_signs == nullptr;
}

// The last part's kernel completes the earlier parts' sum in its epilogue (QlinearFusion::prior)
// and stores the split outputs or the SwiGLU product itself, so no split or SwiGLU kernel runs
// after the parts; otherwise (a part beyond the kernels' direct reach, or GYRE_CUDA_MIXED_PRIOR=0)
// the product goes through the fused scratch and a kernel of its own.
void CudaBackend::mixed_split(const OutSplit& split, const half* x, const Tensor& w, int n,
                              const half* bias, const half* norm, float eps, const half* row_norm) {
  const QMixedDevice& m = qmixed_of(w);
  mixed_split_in(split, m, mixed_input(m, x, n, norm, eps, row_norm), n, bias, false);
}

void CudaBackend::mixed_split_in(const OutSplit& split, const QMixedDevice& m, const MixedInput& in,
                                 int n, const half* bias, bool late_first) {
  if (mixed_pair(m, in, n, nullptr, bias, {}, &split)) return;
  half* fused = fused_scratch(static_cast<size_t>(n) * m.rows);
  if (!in.direct || !mixed_prior_epilogue_) {
    mixed_parts(m, in, fused, n, 0, m.n_parts, bias, false, nullptr, nullptr, late_first);
    split_rows(split, fused, n, m.rows, stream_);
    return;
  }
  const int last = m.n_parts - 1, p = part_at(m, last, n);
  mixed_parts(m, in, fused, n, 0, last, bias, false, nullptr, nullptr, late_first);
  QlinearFusion f = part_fusion(in, p);
  f.prior = last > 0 ? fused : nullptr;
  f.x_ready = (last > 0 || late_first) && mixed_late_wait_;
  qlinear_matmul_split(m.parts[p], in.x[p], split, n, last > 0 ? nullptr : bias, stream_, f);
}

bool CudaBackend::mixed_swiglu(half* out, const half* x, const Tensor& w, int n, int hidden,
                               const half* norm, float eps, const half* row_norm,
                               const QMixedDevice* reader) {
  const QMixedDevice& m = qmixed_of(w);
  const int rows = static_cast<int>(w.rows);
  const MixedInput in = mixed_input(m, x, n, norm, eps, row_norm);
  QlinearFusion pf;
  if (reader != nullptr) pf.y_index = reader->pos;
  if (mixed_pair(m, in, n, reader != nullptr ? reader->row : out, nullptr, pf, nullptr, hidden))
    return reader != nullptr;
  half* fused = fused_scratch(static_cast<size_t>(n) * rows);
  const int last = m.n_parts - 1, p = part_at(m, last, n);
  if (in.direct && mixed_prior_epilogue_) {
    mixed_parts(m, in, fused, n, 0, last, nullptr, false);
    QlinearFusion f = part_fusion(in, p);
    f.prior = last > 0 ? fused : nullptr;
    f.x_ready = last > 0 && mixed_late_wait_;
    if (reader != nullptr) f.y_index = reader->pos;
    if (qlinear_gemv_swiglu(m.parts[p], in.x[p], reader != nullptr ? reader->row : out, n, hidden,
                            stream_, f))
      return reader != nullptr;
    mixed_parts(m, in, fused, n, last, m.n_parts, nullptr, last > 0);
  } else {
    mixed_parts(m, in, fused, n, 0, m.n_parts, nullptr, false);
  }
  swiglu_interleaved(out, fused, n, hidden, rows, kSwigluBlock, stream_);
  return false;
}

bool CudaBackend::mixed_matmul(const QMixedDevice& m, const half* x, half* y, int n,
                               const half* bias, bool accumulate, const half* norm, float eps,
                               half* y_perm, const int32_t* y_perm_index, bool x_in_row) {
  const MixedInput in = mixed_input(m, x, n, norm, eps, nullptr, x_in_row);
  if (!in.direct) y_perm = nullptr;
  mixed_parts(m, in, y, n, 0, m.n_parts, bias, accumulate, y_perm, y_perm_index);
  return y_perm != nullptr;
}

CudaBackend::MixedInput CudaBackend::mixed_input(const QMixedDevice& m, const half* x, int n,
                                                 const half* norm, float eps, const half* row_norm,
                                                 bool x_in_row) {
  MixedInput in;
  static_assert(sizeof(in.x) / sizeof(in.x[0]) == kMixedMaxParts);
  if (x_in_row) {  // the row the kernel before filled (matmul_add)
    GYRE_CHECK(n == 1 && m.row != nullptr, "internal: a mixed row for ", n, " rows");
    for (int p = 0; p < m.n_parts; ++p) in.x[p] = m.row + m.row_offset[p];
    in.row = m.row;
    return in;
  }
  if (row_norm != nullptr) {  // the row the residual's producer filled (take_mixed_row)
    GYRE_CHECK(n == 1 && m.row_norm, "internal: a mixed row for ", n, " rows");
    in.x_cols = m.row_cols;
    in.norm = row_norm;
    in.eps = eps;
    in.norm_cols = m.cols;
    for (int p = 0; p < m.n_parts; ++p) {
      in.x[p] = m.row;
      in.offset[p] = m.row_offset[p];
    }
    in.row = m.row;
    return in;
  }
  if (m.n_parts == 2 && m.row_list != nullptr &&
      qlinear_pair_supported(m.parts[0], m.parts[1], m.row_cols, n)) {
    // For the two-part kernel (mixed_pair): the rows gathered in the decode row's layout, one
    // list for both parts (the norm applied on the way).
    half* rows = mixed_scratch(static_cast<size_t>(n) * m.row_cols);
    MixedGather g;
    g.parts = 1;
    g.k[0] = m.row_cols;
    gather_parts(rows, x, m.row_list, n, m.cols, g, stream_, norm, eps);
    for (int p = 0; p < m.n_parts; ++p) in.x[p] = rows + m.row_offset[p];
    in.row = rows;
    return in;
  }
  MixedGather g;
  g.parts = m.n_parts;
  size_t halves = 0;
  for (int p = 0; p < m.n_parts; ++p) {
    g.k[p] = m.parts[p].desc.cols;
    g.offset[p] = static_cast<int64_t>(halves);
    halves += aligned_halves(static_cast<size_t>(n) * g.k[p]);
    in.direct = in.direct && n < kDequantGemmMinRows && qlinear_runs_direct(m.parts[p], n);
  }
  // Without the kernels' accumulate fusion, each product after the first goes through partial.
  const size_t partial_at = halves;
  if (!in.direct) halves += static_cast<size_t>(n) * m.rows;
  half* scratch = mixed_scratch(halves);
  gather_parts(scratch, x, m.cols_all, n, m.cols, g, stream_, norm, eps);
  for (int p = 0; p < m.n_parts; ++p) in.x[p] = scratch + g.offset[p];
  if (!in.direct) in.partial = scratch + partial_at;
  return in;
}

QlinearFusion CudaBackend::part_fusion(const MixedInput& in, int p) {
  QlinearFusion f;
  if (in.x_cols == 0) return f;
  f.x_cols = in.x_cols;
  f.x_offset = in.offset[p];
  f.norm_cols = in.norm_cols;
  f.norm_w = in.norm;
  f.norm_eps = in.eps;
  return f;
}

bool CudaBackend::mixed_pair(const QMixedDevice& m, const MixedInput& in, int n, half* y,
                             const half* bias, const QlinearFusion& f, const OutSplit* split,
                             int hidden) {
  if (m.n_parts != 2 || !in.direct || in.row == nullptr ||
      !qlinear_pair_supported(m.parts[0], m.parts[1], m.row_cols, n))
    return false;
  QlinearPairRow r;
  r.row = in.row;
  r.n = n;
  r.cols = m.row_cols;
  r.offset[0] = m.row_offset[0];
  r.offset[1] = m.row_offset[1];
  r.norm_w = in.norm;  // the residual's row (take_mixed_row); null when the gather or the
                       // kernel before wrote the row
  r.norm_eps = in.eps;
  r.norm_cols = in.norm_cols;
  qlinear_gemv_pair(m.parts[0], m.parts[1], r, y, bias, stream_, f, split, hidden);
  return true;
}

void CudaBackend::mixed_parts(const QMixedDevice& m, const MixedInput& in, half* y, int n,
                              int first, int last, const half* bias, bool accumulate, half* y_perm,
                              const int32_t* y_perm_index, bool late_first) {
  if (first == 0 && last == m.n_parts) {
    QlinearFusion f;
    f.accumulate = accumulate;
    f.y_perm = y_perm;
    f.y_perm_index = y_perm_index;
    if (mixed_pair(m, in, n, y, bias, f)) return;
  }
  for (int i = first; i < last; ++i) {
    const int p = part_at(m, i, n);
    const half* b = i == first ? bias : nullptr;
    const bool add = accumulate || i > first;
    if (in.direct) {
      QlinearFusion f = part_fusion(in, p);
      f.accumulate = add;
      f.x_ready = (i > first || late_first) && mixed_late_wait_;  // the kernel before: a part
      if (i + 1 == last) {  // the sum complete: its copy in the next reader's order
        f.y_perm = y_perm;
        f.y_perm_index = y_perm_index;
      }
      qlinear_matmul(m.parts[p], in.x[p], y, n, b, stream_, f);
    } else if (!add) {
      packed_part_matmul(m.parts[p], in.x[p], y, n, b);
    } else {
      packed_part_matmul(m.parts[p], in.x[p], in.partial, n, b);
      // cuda::add: the member add takes Tensors.
      cuda::add(y, in.partial, static_cast<int64_t>(n) * m.rows, stream_);
    }
  }
}

}  // namespace gyre::cuda
