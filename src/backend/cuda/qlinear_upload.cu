// Quantized weights on the device (qlinear.h): their byte sizes, views into a caller's memory,
// uploads that repack the host layout into each kernel family's, permutations, and freeing.
#include <vector>

#include "backend/cuda/qlinear_internal.h"
#include "core/error.h"

namespace gyre {

using qlinear_detail::check_cuda;
using qlinear_detail::layout_params;
using qlinear_detail::Params;

namespace {

size_t align256(size_t v) {
  return (v + 255) / 256 * 256;
}

// Byte sizes of the device qweight and scale arrays: the host layout for 8-bit and untiled narrow
// widths (qlinear_bits.cu), the tiled layouts for 4-bit (qlinear_tiled.cu) and tiled narrow
// widths (qlinear_stream.cuh: 128 * bits bytes per 16x64 block).
void device_sizes(const QWeightDesc& d, size_t& qbytes, size_t& scale_bytes) {
  if (d.trellis) {
    qlinear_detail::trellis_device_sizes(d, qbytes, scale_bytes);
  } else if (d.bits == 4 || qlinear_detail::bits_tiled_layout(d)) {
    QWeightDevice w;
    w.desc = d;
    w.narrow_tiled = qlinear_detail::bits_tiled_layout(d);
    const Params p = layout_params(w);
    qbytes = static_cast<size_t>(p.tiles) * p.kblocks * 128 * d.bits;
    scale_bytes = static_cast<size_t>(p.tiles) * p.groups_p * 16 * d.scale_bytes();
  } else {
    qbytes = static_cast<size_t>(d.qweight_bytes());
    scale_bytes = static_cast<size_t>(d.scale_count()) * d.scale_bytes();
  }
}

}  // namespace

size_t qweight_device_bytes(const QWeightDesc& d) {
  size_t qbytes = 0, scale_bytes = 0;
  device_sizes(d, qbytes, scale_bytes);
  return align256(qbytes) + align256(scale_bytes) + (d.asymmetric ? align256(scale_bytes) : 0) +
         (d.has_perm ? 2 * align256(static_cast<size_t>(d.cols) * 4) : 0);
}

QWeightDevice qweight_device_view(const QWeightDesc& d, void* mem) {
  qweight_validate(d);
  size_t qbytes = 0, scale_bytes = 0;
  device_sizes(d, qbytes, scale_bytes);
  QWeightDevice out;
  out.desc = d;
  out.narrow_tiled = qlinear_detail::bits_tiled_layout(d);
  out.narrow_inplace = out.narrow_tiled > 0 && qlinear_detail::bits_inplace_layout(d);
  auto* p = static_cast<uint8_t*>(mem);
  out.qweight = p;
  p += align256(qbytes);
  out.scales = p;
  p += align256(scale_bytes);
  if (d.asymmetric) {
    out.mins = p;
    p += align256(scale_bytes);
  }
  if (d.has_perm) {
    out.perm = reinterpret_cast<const int32_t*>(p);
    out.inv_perm = reinterpret_cast<const int32_t*>(p + align256(static_cast<size_t>(d.cols) * 4));
  }
  return out;
}

QWeightDevice qweight_upload(const QWeightHost& w) {
  const QWeightDesc& d = w.desc;
  qweight_validate(d);
  GYRE_CHECK(static_cast<int64_t>(w.qweight.size()) == d.qweight_bytes() &&
                 static_cast<int64_t>(w.scales.size()) == d.scale_count() * d.scale_bytes() &&
                 w.mins.size() == (d.asymmetric ? w.scales.size() : 0) &&
                 w.perm.size() == (d.has_perm ? static_cast<size_t>(d.cols) : 0),
             "qweight_upload: buffers do not match the layout");
  void* mem = nullptr;
  check_cuda(cudaMalloc(&mem, qweight_device_bytes(d)), "cudaMalloc (quantized weight)");
  QWeightDevice out = qweight_device_view(d, mem);
  out.allocation = mem;
  auto put = [&](const void* dst, const void* src, size_t bytes) {
    check_cuda(cudaMemcpy(const_cast<void*>(dst), src, bytes, cudaMemcpyHostToDevice),
               "cudaMemcpy (weight)");
  };
  try {
    if (d.trellis) {
      qlinear_detail::trellis_upload(w, const_cast<uint8_t*>(out.qweight),
                                     static_cast<uint8_t*>(const_cast<void*>(out.scales)));
    } else if (d.bits == 4) {
      qlinear_detail::prepare_batch4();
      qlinear_detail::prepare_batch_bulk();
      qlinear_detail::prepare_batch_stream();
      const Params p = layout_params(out);
      qlinear_detail::tile_int4_upload(
          w.qweight.data(), w.scales.data(), d.asymmetric ? w.mins.data() : nullptr, p,
          const_cast<uint8_t*>(out.qweight), static_cast<uint8_t*>(const_cast<void*>(out.scales)),
          static_cast<uint8_t*>(const_cast<void*>(out.mins)));
    } else if (out.narrow_tiled) {
      qlinear_detail::prepare_batch_stream();
      qlinear_detail::tile_bits_upload(w, layout_params(out), out.narrow_tiled,
                                       const_cast<uint8_t*>(out.qweight),
                                       static_cast<uint8_t*>(const_cast<void*>(out.scales)),
                                       static_cast<uint8_t*>(const_cast<void*>(out.mins)));
    } else {
      put(out.qweight, w.qweight.data(), w.qweight.size());
      put(out.scales, w.scales.data(), w.scales.size());
      if (d.asymmetric) put(out.mins, w.mins.data(), w.mins.size());
    }
    if (d.has_perm) qweight_put_perm(out, w.perm.data(), nullptr);
  } catch (...) {
    qweight_free(out);
    throw;
  }
  return out;
}

void qweight_put_perm(const QWeightDevice& w, const int32_t* perm, cudaStream_t stream) {
  GYRE_CHECK(w.perm != nullptr && w.inv_perm != nullptr,
             "qweight_put_perm: the weight has no permutation");
  const size_t cols = static_cast<size_t>(w.desc.cols);
  std::vector<int32_t> inv(cols, -1);
  for (size_t c = 0; c < cols; ++c) {
    GYRE_CHECK(perm[c] >= 0 && static_cast<size_t>(perm[c]) < cols && inv[perm[c]] < 0,
               "qweight_put_perm: not a permutation of ", cols, " columns");
    inv[perm[c]] = static_cast<int32_t>(c);
  }
  check_cuda(
      cudaMemcpyAsync(const_cast<int32_t*>(w.perm), perm, cols * 4, cudaMemcpyHostToDevice, stream),
      "cudaMemcpyAsync (permutation)");
  check_cuda(cudaMemcpyAsync(const_cast<int32_t*>(w.inv_perm), inv.data(), cols * 4,
                             cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync (permutation)");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (permutation)");
}

void qweight_free(QWeightDevice& w) {
  if (w.allocation != nullptr) cudaFree(w.allocation);
  w = QWeightDevice{};
}

}  // namespace gyre
