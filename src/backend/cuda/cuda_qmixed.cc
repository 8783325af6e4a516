// Mixed-width linear weights on the CUDA backend (qmixed_device.h): upload, and the matmul as
// the sum of the two parts' products, each through qlinear's kernels (decode and batches up to
// the part's direct limit) or a dequantized FP16 GEMM/GEMV beyond it, as plain packed weights do.
#include <memory>
#include <utility>

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

Tensor CudaBackend::upload_mixed(const QMixedHost& host) {
  qmixed_validate(host);
  struct Owner {
    QMixedDevice d;
    std::shared_ptr<void> cols;
    std::shared_ptr<void> signs;
    ~Owner() {
      qweight_free(d.hi);
      qweight_free(d.lo);
    }
  };
  auto o = std::make_shared<Owner>();
  o->d.rows = host.rows;
  o->d.cols = host.cols;
  o->d.hi = qweight_upload(host.hi);
  o->d.lo = qweight_upload(host.lo);
  const size_t n_hi = host.hi_cols.size(), n_lo = host.lo_cols.size();
  o->cols = device_alloc((n_hi + n_lo) * sizeof(int32_t), "mixed weight columns");
  auto* cols = static_cast<int32_t*>(o->cols.get());
  GYRE_CUDA_CHECK(cudaMemcpy(cols, host.hi_cols.data(), n_hi * 4, cudaMemcpyHostToDevice));
  GYRE_CUDA_CHECK(cudaMemcpy(cols + n_hi, host.lo_cols.data(), n_lo * 4, cudaMemcpyHostToDevice));
  o->d.hi_cols = cols;
  o->d.lo_cols = cols + n_hi;
  if (host.had.active()) {
    o->signs = upload_hadamard_signs(host.had, host.cols);
    o->d.had_signs = static_cast<const int8_t*>(o->signs.get());
    o->d.had_block = host.had.block;
  }
  weight_bytes_ += qweight_device_bytes(host.hi.desc) + qweight_device_bytes(host.lo.desc) +
                   (n_hi + n_lo) * sizeof(int32_t);
  Tensor t;
  t.dtype = DType::QPACKED;
  t.rows = host.rows;
  t.cols = host.cols;
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

void CudaBackend::mixed_matmul(const QMixedDevice& m, const half* x, half* y, int n,
                               const half* bias) {
  const int k_hi = m.hi.desc.cols, k_lo = m.lo.desc.cols;
  const size_t x_hi = aligned_halves(static_cast<size_t>(n) * k_hi);
  const size_t x_lo = aligned_halves(static_cast<size_t>(n) * k_lo);
  half* scratch = mixed_scratch(x_hi + x_lo + static_cast<size_t>(n) * m.rows);
  half* xh = scratch;
  half* xl = scratch + x_hi;
  half* partial = xl + x_lo;
  gather_columns(xh, x, m.hi_cols, n, m.cols, k_hi, stream_);
  gather_columns(xl, x, m.lo_cols, n, m.cols, k_lo, stream_);
  packed_part_matmul(m.hi, xh, y, n, bias);
  packed_part_matmul(m.lo, xl, partial, n, nullptr);
  cuda::add(y, partial, static_cast<int64_t>(n) * m.rows, stream_);  // the member add takes Tensors
}

}  // namespace gyre::cuda
