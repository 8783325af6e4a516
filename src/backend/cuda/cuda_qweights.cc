// Quantized linear weights of the CUDA backend, through qlinear (qlinear.h): GGUF blocks are
// repacked exactly, QPACKED weights (GPTQ, `gyre convert` output at 2/3/4/5/6/8 bits) are uploaded
// as they are, F16/BF16/F32 weights are requantized when BackendOptions::weight_bits is set, and
// synthetic benchmark weights get random packed bytes and scales made on the GPU. Such a Tensor has
// dtype Q4_0 (4-bit) or Q8_0 (every other width) as a marker, data pointing at the QWeightDevice
// that its owner keeps alive; matmul() dispatches on that marker and then on the descriptor's bits.
#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/qmixed.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_buffers.h"
#include "backend/cuda/qlinear.h"

namespace gyre::cuda {

namespace {

// The projections and the LM head (canonical names, model/weights.h); everything else, the
// embedding table included (embed() gathers its rows), stays FP16.
bool is_linear_weight(const TensorView& w) {
  const std::string suffix = "_proj.weight";
  const bool proj = w.name.size() > suffix.size() &&
                    w.name.compare(w.name.size() - suffix.size(), suffix.size(), suffix) == 0;
  return w.shape.size() == 2 && (proj || w.name == "lm_head.weight");
}

Tensor qtensor(std::shared_ptr<QWeightDevice> q, std::shared_ptr<void> memory) {
  Tensor t;
  t.dtype = q->desc.bits == 4 ? DType::Q4_0 : DType::Q8_0;
  t.rows = q->desc.rows;
  t.cols = q->desc.cols;
  t.data = q.get();
  // One owner for both the descriptor and the device memory behind it.
  auto both = std::make_shared<std::pair<std::shared_ptr<QWeightDevice>, std::shared_ptr<void>>>(
      std::move(q), std::move(memory));
  t.owner = both;
  return t;
}

Tensor upload_packed(const QWeightHost& host) {
  std::shared_ptr<QWeightDevice> q(new QWeightDevice(qweight_upload(host)), [](QWeightDevice* p) {
    qweight_free(*p);
    delete p;
  });
  std::shared_ptr<void> signs;
  if (host.had.active()) {
    signs = upload_hadamard_signs(host.had, host.desc.cols);
    q->had_signs = static_cast<const int8_t*>(signs.get());
    q->had_block = host.had.block;
  }
  return qtensor(std::move(q), std::move(signs));
}

}  // namespace

bool is_quantized_tensor(const Tensor& t) {
  return t.dtype == DType::Q4_0 || t.dtype == DType::Q8_0;
}

const QWeightDevice& qweight_of(const Tensor& t) {
  return *static_cast<QWeightDevice*>(t.data);
}

std::pair<std::shared_ptr<QWeightDevice>, std::shared_ptr<void>> CudaBackend::random_packed(
    const QWeightDesc& d, const std::string& what) {
  const size_t bytes = qweight_device_bytes(d);
  auto memory = device_alloc(bytes, what);
  // The device layout of every width (tiled 4-bit and, by default, tiled 2/3/5/6-bit).
  auto q = std::make_shared<QWeightDevice>(qweight_device_view(d, memory.get()));
  auto* base = static_cast<uint8_t*>(memory.get());
  const size_t qbytes = static_cast<size_t>(static_cast<const uint8_t*>(q->scales) - base);
  // Any bytes are valid packed values (and trellis streams); scales (the rest: symmetric, no
  // perm) are small positive halves.
  fill_random(reinterpret_cast<half*>(base), static_cast<int64_t>(qbytes / 2), synthetic_seed_++,
              1.0f, 0.0f, stream_);
  fill_random(reinterpret_cast<half*>(base + qbytes), static_cast<int64_t>((bytes - qbytes) / 2),
              synthetic_seed_++, 0.5f / static_cast<float>(d.cols),
              1.0f / static_cast<float>(d.cols), stream_);
  weight_bytes_ += bytes;
  return {std::move(q), std::move(memory)};
}

bool CudaBackend::try_upload_quantized(const TensorView& w, Tensor& out) {
  if (is_qmixed_view(w)) {  // two packed parts (backend/cpu/qmixed.h)
    out = upload_mixed(qmixed_of_view(w));
    return true;
  }
  if (w.dtype == DType::QPACKED) {  // already in the kernels' layout (e.g. GPTQ)
    const QWeightHost& host = qweight_of_view(w);
    weight_bytes_ += qweight_device_bytes(host.desc);
    out = upload_packed(host);
    return true;
  }
  if (!is_linear_weight(w)) return false;
  const int rows = static_cast<int>(w.rows()), cols = static_cast<int>(w.cols());
  if (synthetic_) {
    if (options_.weight_bits == 0) return false;
    QWeightDesc d;
    d.bits = options_.weight_bits;
    d.group_size = options_.group_size;
    d.rows = rows;
    d.cols = cols;
    if (synthetic_trellis_) {
      d.trellis = true;
      if (hadamard_block_for(cols) != 0) d.group_size = hadamard_block_for(cols);
    }
    // GYRE_SYNTHETIC_ACT_ORDER=1: every weight also carries a random column permutation, as
    // act-order GPTQ layers do, to measure what gathering x through it costs a decode step; 2:
    // every weight but down_proj, as a real act-order model loads (engine/mlp_order.h); 3 and 4
    // (to attribute the cost): as 2 without o_proj's, or without the LM head's.
    const char* act = std::getenv("GYRE_SYNTHETIC_ACT_ORDER");
    const std::string act_mode = act != nullptr ? act : "";
    auto named = [&](const char* part) { return w.name.find(part) != std::string::npos; };
    d.has_perm = !d.trellis && (act_mode == "1" || (act_mode == "2" && !named("down_proj")) ||
                                (act_mode == "3" && !named("down_proj") && !named("o_proj")) ||
                                (act_mode == "4" && !named("down_proj") && !named("lm_head")));
    qweight_validate(d);
    if (const char* mix = std::getenv("GYRE_SYNTHETIC_MIX"); mix != nullptr && *mix != 0) {
      const char* only = std::getenv("GYRE_SYNTHETIC_MIX_LAYERS");
      bool chosen = w.name != "lm_head.weight";
      if (only != nullptr && *only != 0) {
        chosen = false;
        std::string list = std::string(only) + ",";
        std::replace(list.begin(), list.end(), '/', ',');
        for (size_t a = 0, b; (b = list.find(',', a)) != std::string::npos; a = b + 1)
          chosen = chosen || (b > a && named(list.substr(a, b - a).c_str()));
      }
      if (chosen) {
        out = synthetic_mixed(rows, cols, mix, w.name);
        return true;
      }
    }
    auto [q, memory] = random_packed(d, "weight " + w.name);
    if (d.has_perm) {
      std::vector<int32_t> perm(static_cast<size_t>(cols));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(),
                   std::mt19937(static_cast<uint32_t>(synthetic_seed_++)));
      qweight_put_perm(*q, perm.data(), stream_);
    }
    GYRE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    // GYRE_SYNTHETIC_HADAMARD=1: every weight also carries a random rotation (hadamard.h), to
    // measure what rotating the activations costs a decode step.
    const char* had = std::getenv("GYRE_SYNTHETIC_HADAMARD");
    if (had != nullptr && std::string(had) == "1" && hadamard_block_for(cols) != 0) {
      const HadamardRotation r{hadamard_random_signs(cols, synthetic_seed_++),
                               hadamard_block_for(cols)};
      auto signs = upload_hadamard_signs(r, cols);
      q->had_signs = static_cast<const int8_t*>(signs.get());
      q->had_block = r.block;
      memory = std::make_shared<std::pair<std::shared_ptr<void>, std::shared_ptr<void>>>(
          std::move(memory), std::move(signs));
    }
    out = qtensor(q, memory);
    return true;
  }
  QWeightHost host;
  if (dtype_info(w.dtype).quantized) {
    if (!qweight_gguf_supported(w.dtype)) return false;
    host = qweight_pack_from_gguf(w.dtype, w.data, rows, cols);
  } else if (options_.weight_bits != 0 &&
             (w.dtype == DType::F16 || w.dtype == DType::BF16 || w.dtype == DType::F32)) {
    if (cols % options_.group_size != 0) return false;  // this shape stays FP16
    std::vector<float> f(static_cast<size_t>(rows) * cols);
    const size_t row_bytes = dtype_row_bytes(w.dtype, cols);
    std::vector<uint8_t> aligned(row_bytes);
    for (int r = 0; r < rows; ++r) {
      std::copy_n(static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * row_bytes,
                  row_bytes, aligned.begin());
      dequantize_row(w.dtype, aligned.data(), f.data() + static_cast<size_t>(r) * cols, cols);
    }
    host = qweight_pack_from_f32(f.data(), rows, cols, options_.weight_bits, options_.group_size,
                                 false);
  } else {
    return false;
  }
  weight_bytes_ += qweight_device_bytes(host.desc);
  out = upload_packed(host);
  return true;
}

}  // namespace gyre::cuda

namespace gyre {

void cuda_set_synthetic_trellis(Backend& backend, bool on) {
  auto* c = dynamic_cast<cuda::CudaBackend*>(&backend);
  GYRE_CHECK(c != nullptr, "backend ", backend.name(), " is not a CUDA backend");
  c->set_synthetic_trellis(on);
}

}  // namespace gyre
