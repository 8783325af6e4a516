// Inputs handed from one kernel to the next in the order the next one reads them (the CUDA
// backend's decode hand-overs): the residual in an act-order weight's column order or in a mixed
// weight's decode row (written by the producer's epilogue, matmul_add's `next`), and the records
// that let the reader take it. The attention's hand-over to o_proj is in cuda_ops.cc.
#include <utility>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_buffers.h"
#include "backend/cuda/qlinear.h"
#include "backend/cuda/qmixed_device.h"

namespace gyre::cuda {

namespace {

// A reader's norm weights in its own layout (CudaBackend::permuted_norms_ entry pn): true when pn
// holds them for this norm and weight; else, outside a graph capture (they are made in the eager
// run before any capture), pn gets `halves` new values and fill() writes them.
template <class Entry, class Fill>
bool reader_norm(Entry& pn, const Tensor& norm, const Tensor& wt, bool capturing, size_t halves,
                 const char* what, Fill&& fill) {
  if (pn.values != nullptr && pn.norm_owner.lock() == norm.owner &&
      pn.weight_owner.lock() == wt.owner)
    return true;
  if (capturing) return false;
  pn.values = device_alloc(halves * sizeof(half), what);
  fill(static_cast<half*>(pn.values.get()));
  pn.norm_owner = norm.owner;
  pn.weight_owner = wt.owner;
  return true;
}

}  // namespace

// reader: a mixed down_proj takes the SwiGLU product in its decode row, written by the epilogue
// of the gate|up kernel (no gather before its parts).
const QMixedDevice* CudaBackend::row_reader(const Tensor* reader, const Tensor& out, int n) const {
  if (reader == nullptr || n != 1 || !mixed_row_enabled_ || !is_mixed_tensor(*reader) ||
      reader->cols != out.cols)
    return nullptr;
  const QMixedDevice& m = qmixed_of(*reader);
  return m.row != nullptr ? &m : nullptr;
}

half* CudaBackend::permuted_residual(size_t halves) {
  grow(xperm_, halves * sizeof(half), "the permuted residual");
  return xperm_.as<half>();
}

// Why: an act-order weight's decode GEMV otherwise scatters x through inv_perm into every thread
// block's staging (qlinear_stream.cuh), which cost the Llama-3-8B shape 10% of its decode speed
// at 4 bits (bench/NOTES.md, session 16); the producer of the residual writes one permuted copy
// in its epilogue instead, for the price of one scattered 2-byte store per element.
bool CudaBackend::take_permuted(const NormedInput& in, const Tensor& wt, QWeightDevice& plain,
                                const half*& x, const half*& norm) {
  const QWeightDevice& w = qweight_of(wt);
  const PermutedCopy rec = permuted_;
  permuted_ = {};
  if (w.perm == nullptr || rec.x != in.x.data || rec.n != in.x.rows || rec.perm != w.perm ||
      in.norm.owner == nullptr || wt.owner == nullptr)
    return false;
  PermutedNorm& pn =
      permuted_norms_[std::make_pair(static_cast<const void*>(in.norm.data), w.perm)];
  if (!reader_norm(pn, in.norm, wt, capturing_, static_cast<size_t>(in.x.cols),
                   "permuted norm weights", [&](half* out) {
                     qlinear_gather_input(w, static_cast<const half*>(in.norm.data), out, 1,
                                          stream_);
                   }))
    return false;
  plain = w;
  plain.perm = nullptr;
  plain.inv_perm = nullptr;
  x = xperm_.as<const half>();
  norm = static_cast<const half*>(pn.values.get());
  ++permuted_handoffs_;
  return true;
}

// A mixed reader: its parts stage the row the producer filled (QMixedDevice::row) with the norm
// over it, instead of a gather launch before them (cuda_qmixed.cc).
const half* CudaBackend::take_mixed_row(const NormedInput& in, const Tensor& wt) {
  const PermutedCopy rec = permuted_;
  permuted_ = {};
  const QMixedDevice& m = qmixed_of(wt);
  if (!m.row_norm || rec.x != in.x.data || rec.n != 1 || in.x.rows != 1 || rec.perm != m.pos ||
      in.norm.owner == nullptr || wt.owner == nullptr)
    return nullptr;
  PermutedNorm& pn = permuted_norms_[std::make_pair(static_cast<const void*>(in.norm.data), m.pos)];
  if (!reader_norm(pn, in.norm, wt, capturing_, static_cast<size_t>(m.row_cols),
                   "mixed row norm weights", [&](half* out) {
                     MixedGather g;
                     g.parts = 1;
                     g.k[0] = m.row_cols;
                     gather_parts(out, static_cast<const half*>(in.norm.data), m.row_list, 1,
                                  m.cols, g, stream_);
                   }))
    return nullptr;
  ++permuted_handoffs_;
  return static_cast<const half*>(pn.values.get());
}

// Where matmul_add writes the residual a second time for `next`, its reader: an act-order
// weight's column order (permuted_residual) or a mixed weight's decode row; none otherwise.
CudaBackend::ResidualCopy CudaBackend::residual_copy(const Tensor* next, const Tensor& residual,
                                                     int n) {
  if (!permuted_residual_enabled_ || next == nullptr || next->cols != residual.cols) return {};
  if (is_mixed_tensor(*next)) {
    const QMixedDevice& m = qmixed_of(*next);
    if (n != 1 || !m.row_norm || !mixed_row_enabled_ || !mixed_fuses_norm(*next)) return {};
    return {m.row, m.pos, m.pos};
  }
  const size_t halves = static_cast<size_t>(residual.rows) * residual.cols;
  if (is_quantized_tensor(*next) && qweight_of(*next).perm != nullptr &&
      qweight_of(*next).inv_perm != nullptr && fuses_norms(n, *next) &&
      (!capturing_ || halves * sizeof(half) <= xperm_.bytes))
    return {permuted_residual(halves), qweight_of(*next).inv_perm, qweight_of(*next).perm};
  return {};
}

}  // namespace gyre::cuda
