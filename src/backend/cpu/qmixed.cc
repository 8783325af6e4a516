#include "backend/cpu/qmixed.h"

#include <vector>

#include "core/error.h"

namespace gyre {

double QMixedHost::bits_per_weight() const {
  const double total = static_cast<double>(rows) * cols;
  const auto part_bits = [](const QWeightHost& p) {
    return p.desc.bits_per_weight() * p.desc.rows * static_cast<double>(p.desc.cols);
  };
  const double list_bits = 32.0 * static_cast<double>(hi_cols.size()) / hi.desc.group_size;
  return (part_bits(hi) + part_bits(lo) + list_bits) / total;
}

void qmixed_validate(const QMixedHost& m) {
  GYRE_CHECK(m.rows > 0 && m.cols > 0, "mixed weight: empty shape");
  for (const QWeightHost* p : {&m.hi, &m.lo}) {
    qweight_validate(p->desc);
    GYRE_CHECK(p->desc.rows == m.rows && !p->desc.has_perm && !p->had.active(),
               "mixed weight: a part of ", p->desc.rows, " rows (expected ", m.rows,
               "), with a permutation or with a rotation of its own");
  }
  GYRE_CHECK(static_cast<int64_t>(m.hi_cols.size()) == m.hi.desc.cols &&
                 static_cast<int64_t>(m.lo_cols.size()) == m.lo.desc.cols &&
                 m.hi.desc.cols + m.lo.desc.cols == m.cols,
             "mixed weight: parts of ", m.hi.desc.cols, " + ", m.lo.desc.cols,
             " columns do not cover ", m.cols);
  std::vector<char> seen(static_cast<size_t>(m.cols), 0);
  for (const auto* idx : {&m.hi_cols, &m.lo_cols})
    for (int32_t c : *idx) {
      GYRE_CHECK(c >= 0 && c < m.cols && !seen[c], "mixed weight: column ", c,
                 " is out of range or in both parts");
      seen[c] = 1;
    }
}

void qmixed_dequantize_row(const QMixedHost& m, int64_t r, float* out) {
  std::vector<float> part;
  for (const auto& [w, idx] : {std::pair{&m.hi, &m.hi_cols}, std::pair{&m.lo, &m.lo_cols}}) {
    part.resize(static_cast<size_t>(w->desc.cols));
    qweight_dequantize_row(*w, r, part.data());
    for (size_t j = 0; j < part.size(); ++j) out[(*idx)[j]] = part[j];
  }
  if (m.had.active()) hadamard_unrotate_rows(out, 1, m.cols, m.had);
}

TensorView qmixed_view(const std::string& name, const QMixedHost& m) {
  TensorView v;
  v.name = name;
  v.dtype = DType::QPACKED;
  v.shape = {m.rows, m.cols};
  v.data = &m;
  v.nbytes = sizeof(QMixedHost);
  return v;
}

bool is_qmixed_view(const TensorView& v) {
  static_assert(sizeof(QMixedHost) != sizeof(QWeightHost));
  return v.dtype == DType::QPACKED && v.nbytes == sizeof(QMixedHost);
}

const QMixedHost& qmixed_of_view(const TensorView& v) {
  GYRE_CHECK(is_qmixed_view(v) && v.data != nullptr, "tensor ", v.name,
             " is not a mixed quantized weight");
  const auto& m = *static_cast<const QMixedHost*>(v.data);
  GYRE_CHECK(v.shape.size() == 2 && v.shape[0] == m.rows && v.shape[1] == m.cols, "tensor ", v.name,
             " has shape ", shape_str(v.shape), " but its mixed weight is [", m.rows, ", ", m.cols,
             "]");
  return m;
}

bool qmixed_same_layout(const QMixedHost& a, const QMixedHost& b) {
  return a.cols == b.cols && a.hi_cols == b.hi_cols && a.lo_cols == b.lo_cols &&
         qweight_same_layout(a.hi, b.hi) && qweight_same_layout(a.lo, b.lo) && a.had == b.had;
}

QMixedHost qmixed_concat_rows(const std::vector<const QMixedHost*>& parts) {
  GYRE_CHECK(!parts.empty(), "mixed weight: nothing to concatenate");
  std::vector<const QWeightHost*> his, los;
  QMixedHost out;
  for (const QMixedHost* p : parts) {
    GYRE_CHECK(qmixed_same_layout(*parts[0], *p), "mixed weights of different layouts");
    his.push_back(&p->hi);
    los.push_back(&p->lo);
    out.rows += p->rows;
  }
  out.cols = parts[0]->cols;
  out.hi = qweight_concat_rows(his);
  out.lo = qweight_concat_rows(los);
  out.hi_cols = parts[0]->hi_cols;
  out.lo_cols = parts[0]->lo_cols;
  out.had = parts[0]->had;
  return out;
}

QMixedHost qmixed_interleave_rows(const QMixedHost& a, const QMixedHost& b, int block) {
  GYRE_CHECK(qmixed_same_layout(a, b) && a.rows == b.rows, "mixed weights of different layouts");
  QMixedHost out;
  out.hi = qweight_interleave_rows(a.hi, b.hi, block);
  out.lo = qweight_interleave_rows(a.lo, b.lo, block);
  out.rows = out.hi.desc.rows;
  out.cols = a.cols;
  out.hi_cols = a.hi_cols;
  out.lo_cols = a.lo_cols;
  out.had = a.had;
  return out;
}

}  // namespace gyre
