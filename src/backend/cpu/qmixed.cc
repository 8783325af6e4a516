#include "backend/cpu/qmixed.h"

#include <vector>

#include "core/error.h"

namespace gyre {

double QMixedHost::bits_per_weight() const {
  const double total = static_cast<double>(rows) * cols;
  double bits = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const QWeightDesc& d = parts[i].w.desc;
    bits += d.bits_per_weight() * d.rows * static_cast<double>(d.cols);
    if (i + 1 < parts.size()) bits += 32.0 * static_cast<double>(d.cols) / d.group_size;
  }
  return bits / total;
}

void qmixed_validate(const QMixedHost& m) {
  GYRE_CHECK(m.rows > 0 && m.cols > 0, "mixed weight: empty shape");
  GYRE_CHECK(!m.parts.empty() && m.parts.size() <= static_cast<size_t>(kQMixedMaxParts),
             "mixed weight: ", m.parts.size(), " parts (1 to ", kQMixedMaxParts, " supported)");
  std::vector<char> seen(static_cast<size_t>(m.cols), 0);
  int64_t covered = 0;
  for (const QMixedPart& p : m.parts) {
    qweight_validate(p.w.desc);
    GYRE_CHECK(p.w.desc.rows == m.rows && !p.w.desc.has_perm && !p.w.had.active(),
               "mixed weight: a part of ", p.w.desc.rows, " rows (expected ", m.rows,
               "), with a permutation or with a rotation of its own");
    GYRE_CHECK(static_cast<int64_t>(p.cols.size()) == p.w.desc.cols, "mixed weight: a part of ",
               p.w.desc.cols, " columns lists ", p.cols.size());
    for (int32_t c : p.cols) {
      if (c == -1) continue;
      GYRE_CHECK(c >= 0 && c < m.cols && !seen[c], "mixed weight: column ", c,
                 " is out of range or in two parts");
      seen[c] = 1;
      ++covered;
    }
  }
  GYRE_CHECK(covered == m.cols, "mixed weight: the parts cover ", covered, " of ", m.cols,
             " columns");
}

void qmixed_dequantize_row(const QMixedHost& m, int64_t r, float* out) {
  std::vector<float> part;
  for (const QMixedPart& p : m.parts) {
    part.resize(p.cols.size());
    qweight_dequantize_row(p.w, r, part.data());
    for (size_t j = 0; j < part.size(); ++j)
      if (p.cols[j] >= 0) out[p.cols[j]] = part[j];
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
  if (a.cols != b.cols || a.parts.size() != b.parts.size() || !(a.had == b.had)) return false;
  for (size_t i = 0; i < a.parts.size(); ++i)
    if (a.parts[i].cols != b.parts[i].cols || !qweight_same_layout(a.parts[i].w, b.parts[i].w))
      return false;
  return true;
}

namespace {

// out with a's columns and rotation and parts made by part(i).
template <class MakePart>
QMixedHost with_parts(const QMixedHost& a, MakePart part) {
  QMixedHost out;
  out.cols = a.cols;
  out.had = a.had;
  for (size_t i = 0; i < a.parts.size(); ++i) out.parts.push_back({part(i), a.parts[i].cols});
  out.rows = out.parts[0].w.desc.rows;
  return out;
}

}  // namespace

QMixedHost qmixed_concat_rows(const std::vector<const QMixedHost*>& parts) {
  GYRE_CHECK(!parts.empty(), "mixed weight: nothing to concatenate");
  for (const QMixedHost* p : parts)
    GYRE_CHECK(qmixed_same_layout(*parts[0], *p), "mixed weights of different layouts");
  return with_parts(*parts[0], [&](size_t i) {
    std::vector<const QWeightHost*> ws;
    for (const QMixedHost* p : parts) ws.push_back(&p->parts[i].w);
    return qweight_concat_rows(ws);
  });
}

QMixedHost qmixed_interleave_rows(const QMixedHost& a, const QMixedHost& b, int block) {
  GYRE_CHECK(qmixed_same_layout(a, b) && a.rows == b.rows, "mixed weights of different layouts");
  return with_parts(
      a, [&](size_t i) { return qweight_interleave_rows(a.parts[i].w, b.parts[i].w, block); });
}

}  // namespace gyre
