// Fed decode steps (Backend::fed_steps_begin): between steps the token and position stay on the
// device (step_feed.cu advances them), so the host enqueues a step without waiting for the one
// before; each step's id comes back through host-mapped memory, one event per ring slot. Sampled
// steps read their parameters (the draw) from a host-mapped ring the host fills before each launch.
#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_buffers.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_sample_params.h"
#include "backend/cuda/sampling.h"

namespace gyre::cuda {

namespace {

std::shared_ptr<void> mapped_alloc(size_t bytes, void** device) {
  void* host = nullptr;
  GYRE_CUDA_CHECK(cudaHostAlloc(&host, bytes, cudaHostAllocMapped));
  std::shared_ptr<void> owner(host, [](void* q) { (void)cudaFreeHost(q); });
  GYRE_CUDA_CHECK(cudaHostGetDevicePointer(device, host, 0));
  return owner;
}

// Device words: the greedy pick's maximum and block count (zeroed), the spread argmax word of the
// sampled pick (zeroed), then its result.
constexpr size_t kSampledBestOffset = 16, kSampledOutOffset = 32;

}  // namespace

bool CudaBackend::fed_steps_begin(int token, int pos, const SampleRequest& first) {
  GYRE_CHECK(!capturing_ && !fed_, "internal: fed steps begun twice");
  static const bool enabled = [] {  // GYRE_CUDA_FED=0: step by step, for comparisons
    const char* e = std::getenv("GYRE_CUDA_FED");
    return e == nullptr || std::string(e) != "0";
  }();
  const bool sampled = first.temperature > 0.0f;
  // The picks return ids only; penalties would need each step's history.
  const bool servable = !first.has_penalties() && !first.logprob && first.top_logprobs == 0 &&
                        (!sampled || sample_kernel_serves(first));
  if (!enabled || !graphs_enabled_ || !servable) return false;
  if (!fed_ring_) {
    void* dev = nullptr;
    fed_ring_ = mapped_alloc(kFedRing * sizeof(int32_t), &dev);
    fed_ring_device_ = static_cast<int32_t*>(dev);
    fed_params_ = mapped_alloc(kFedRing * sizeof(SampleRowParams), &dev);
    fed_params_device_ = static_cast<SampleRowParams*>(dev);
    fed_words_ = device_alloc(kSampledOutOffset + sizeof(SampleRowOut), "fed decode steps");
    GYRE_CUDA_CHECK(cudaMemsetAsync(fed_words_.get(), 0, kSampledOutOffset, stream_));
    for (cudaEvent_t& e : fed_events_)
      GYRE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  // The first step's inputs, copied as an eager step's are; the steps advance them from here.
  stage(tokens_, &token, 1);
  stage(positions_, &pos, 1);
  stage(pos0_, &pos, 1);
  fed_ = true;
  fed_sampled_ = sampled;
  return true;
}

void CudaBackend::fed_stage(int pos, const SampleRequest& request) {
  GYRE_CHECK(fed_, "internal: fed_stage outside fed steps");
  GYRE_CHECK((request.temperature > 0.0f) == fed_sampled_,
             "internal: a fed step's request changed between greedy and sampled");
  // The slot's last reader (the step kFedRing before) has finished: the host took its id.
  static_cast<SampleRowParams*>(fed_params_.get())[pos & (kFedRing - 1)] =
      sample_row_params(request);
}

void CudaBackend::fed_pick(const Tensor& logits) {
  GYRE_CHECK(fed_, "internal: fed_pick outside fed steps");
  GYRE_CHECK(logits.dtype == DType::F16 && logits.rows == 1, "fed pick of ", logits.rows, " rows");
  FeedTargets to;
  to.token = static_cast<int32_t*>(tokens_.device.get());
  to.position = static_cast<int32_t*>(positions_.device.get());
  to.pos0 = static_cast<int32_t*>(pos0_.device.get());
  to.ring = fed_ring_device_;
  to.ring_mask = kFedRing - 1;
  char* words = static_cast<char*>(fed_words_.get());
  const half* row = static_cast<const half*>(logits.data);
  if (!fed_sampled_) {
    GreedyFeedArgs a;
    a.logits = row;
    a.vocab = static_cast<int>(logits.cols);
    a.best = reinterpret_cast<unsigned long long*>(words);
    a.done = reinterpret_cast<unsigned int*>(words + 8);
    a.to = to;
    return feed_greedy(a, stream_);
  }
  auto* out = reinterpret_cast<SampleRowOut*>(words + kSampledOutOffset);
  sample_rows(row, logits.cols, static_cast<int>(logits.cols), 1, fed_params_device_, out,
              sample_kernel_mode(), stream_,
              reinterpret_cast<unsigned long long*>(words + kSampledBestOffset), to.pos0,
              kFedRing - 1);
  feed_sampled(out, to, stream_);
}

void CudaBackend::fed_step_launched(int pos) {
  ++fed_steps_;
  GYRE_CUDA_CHECK(cudaEventRecord(fed_events_[pos & (kFedRing - 1)], stream_));
}

int CudaBackend::fed_result(int pos) {
  GYRE_CUDA_CHECK(cudaEventSynchronize(fed_events_[pos & (kFedRing - 1)]));
  const int id = static_cast<volatile int32_t*>(fed_ring_.get())[pos & (kFedRing - 1)];
  GYRE_CHECK(id >= 0, fed_sampled_ ? "no finite logit to sample from (or every logit is NaN)"
                                   : "every logit is NaN");
  return id;
}

void CudaBackend::fed_steps_end() {
  if (!fed_) return;
  fed_ = false;
  // Steps launched beyond the last one read must not run into the next staged inputs.
  GYRE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (StagedInts* s : {&tokens_, &positions_, &pos0_}) s->valid = false;
}

}  // namespace gyre::cuda
