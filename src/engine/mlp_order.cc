#include "engine/mlp_order.h"

#include <numeric>

#include "backend/cpu/qmixed.h"

namespace gyre {

std::vector<TensorView> MlpInDownOrder::gate_up_views(const std::string& gate_name,
                                                      const std::string& up_name) const {
  return {qweight_view(gate_name, gate), qweight_view(up_name, up)};
}

TensorView MlpInDownOrder::down_view(const std::string& name) const {
  return qweight_view(name, down);
}

std::optional<MlpInDownOrder> mlp_in_down_order(const TensorView& gate, const TensorView& up,
                                                const TensorView& down) {
  if (gate.dtype != DType::QPACKED || up.dtype != DType::QPACKED || down.dtype != DType::QPACKED)
    return std::nullopt;
  if (is_qmixed_view(gate) || is_qmixed_view(up) || is_qmixed_view(down))
    return std::nullopt;  // a mix's parts list their own columns (EXL2 widths, Gyre's mixes)
  const QWeightHost& d = qweight_of_view(down);
  const QWeightHost& g = qweight_of_view(gate);
  const QWeightHost& u = qweight_of_view(up);
  if (!d.desc.has_perm || d.desc.trellis || d.had.block != 0 || g.desc.trellis || u.desc.trellis ||
      g.desc.rows != d.desc.cols || u.desc.rows != d.desc.cols)
    return std::nullopt;
  std::vector<int32_t> identity(d.perm.size());
  std::iota(identity.begin(), identity.end(), 0);
  if (d.perm == identity) return std::nullopt;
  MlpInDownOrder out;
  out.gate = qweight_permute_rows(g, d.perm);
  out.up = qweight_permute_rows(u, d.perm);
  out.down = d;
  out.down.desc.has_perm = false;
  out.down.perm.clear();
  return out;
}

}  // namespace gyre
