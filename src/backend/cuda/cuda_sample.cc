// CudaBackend::sample: the per-row settings go up and the results come back through one pinned
// buffer, around the sampling launches (sampling.cu); a step moves a few hundred bytes per row
// instead of a vocabulary of floats.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_buffers.h"
#include "backend/cuda/cuda_sample_params.h"
#include "backend/cuda/sampling.h"

namespace gyre::cuda {

namespace {

bool gpu_sampling_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("GYRE_CUDA_SAMPLE");
    return !(v && std::string(v) == "0");
  }();
  return enabled;
}

}  // namespace

bool sample_kernel_serves(const SampleRequest& r) {
  const bool penalties = !r.penalty_counts.empty() && r.has_penalties();
  return !penalties && r.typical_p >= 1.0f && r.top_logprobs >= 0 &&
         r.top_logprobs <= kSampleMaxTop;
}

SampleRowParams sample_row_params(const SampleRequest& r) {
  SampleRowParams p;
  p.inv_temp = r.temperature > 0.0f ? 1.0f / r.temperature : 0.0f;
  p.top_k = r.top_k;
  p.top_p = r.top_p;
  p.min_p = r.min_p;
  p.uniform = r.uniform;
  p.top_n = r.top_logprobs;
  p.want_logprob = r.logprob ? 1 : 0;
  return p;
}

int sample_kernel_mode() {
  static const int mode = [] {
    const char* v = std::getenv("GYRE_CUDA_SAMPLE_MODE");
    return v && *v ? std::atoi(v) : kSampleDefaultMode;
  }();
  return mode;
}

void CudaBackend::sample(const Tensor& logits, const SampleRequest* requests, int n,
                         SampleResult* out) {
  GYRE_CHECK(n >= 0 && n <= logits.rows, "sample: ", n, " rows asked of a tensor of ", logits.rows);
  if (n == 0) return;
  GYRE_CHECK(logits.dtype == DType::F16, "sample expects FP16 logits");
  if (!gpu_sampling_enabled()) return Backend::sample(logits, requests, n, out);
  GYRE_CHECK(logits.cols > 0 && logits.cols <= (int64_t{1} << 30), "sample: bad vocabulary size ",
             logits.cols);
  // Device: the parameters, the results, then (8-byte aligned) the zeroed words of the spread
  // first pass (sampling.h), which the kernels leave zeroed.
  auto best_offset = [](int rows) {
    const size_t b = static_cast<size_t>(rows) * (sizeof(SampleRowParams) + sizeof(SampleRowOut));
    return (b + 7) / 8 * 8;
  };
  if (n > sample_rows_) {
    const size_t bytes = static_cast<size_t>(n) * (sizeof(SampleRowParams) + sizeof(SampleRowOut));
    sample_pinned_ = pinned_alloc(bytes, "sampling parameters");
    sample_device_ =
        device_alloc(best_offset(n) + static_cast<size_t>(n) * 8, "sampling parameters");
    GYRE_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(sample_device_.get()) + best_offset(n), 0,
                                    static_cast<size_t>(n) * 8, stream_));
    sample_rows_ = n;
  }
  auto* params = static_cast<SampleRowParams*>(sample_pinned_.get());
  auto* results = reinterpret_cast<SampleRowOut*>(params + sample_rows_);
  auto* d_params = static_cast<SampleRowParams*>(sample_device_.get());
  auto* d_results = reinterpret_cast<SampleRowOut*>(d_params + sample_rows_);
  auto* d_best = reinterpret_cast<unsigned long long*>(static_cast<char*>(sample_device_.get()) +
                                                       best_offset(sample_rows_));
  bool any_host = false;
  for (int i = 0; i < n; ++i) {
    params[i] = sample_row_params(requests[i]);
    params[i].skip = sample_kernel_serves(requests[i]) ? 0 : 1;
    any_host = any_host || params[i].skip;
  }
  GYRE_CUDA_CHECK(cudaMemcpyAsync(d_params, params, static_cast<size_t>(n) * sizeof(*params),
                                  cudaMemcpyHostToDevice, stream_));
  sample_rows(static_cast<const half*>(logits.data), logits.cols, static_cast<int>(logits.cols), n,
              d_params, d_results, sample_kernel_mode(), stream_, d_best);
  GYRE_CUDA_CHECK(cudaMemcpyAsync(results, d_results, static_cast<size_t>(n) * sizeof(*results),
                                  cudaMemcpyDeviceToHost, stream_));
  GYRE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (int i = 0; i < n; ++i) {
    if (params[i].skip) continue;
    const SampleRowOut& r = results[i];
    SampleResult& o = out[i];
    o = SampleResult{};
    if (r.error == kSampleAllNan) {
      o.error = "every logit is NaN";
    } else if (r.error == kSampleNoFinite) {
      o.error = "no finite logit to sample from";
    } else {
      o.id = r.id;
      if (params[i].want_logprob || params[i].top_n > 0) o.logprob = r.logprob;
      const int n_top = params[i].top_n > 0 ? std::min(r.n_top, kSampleMaxTop) : 0;
      for (int k = 0; k < n_top; ++k) o.top_logprobs.emplace_back(r.top_ids[k], r.top_logprobs[k]);
    }
  }
  if (any_host)
    for (int i = 0; i < n; ++i)
      if (params[i].skip) Backend::sample(logits.slice_rows(i, 1), &requests[i], 1, &out[i]);
}

}  // namespace gyre::cuda
