// Fed greedy decode steps (Backend::fed_steps_begin): between steps the token and position stay on
// the device (greedy_feed.cu advances them), so the host enqueues a step without waiting for the
// one before; each step's id comes back through host-mapped memory, one event per ring slot.
#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_buffers.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/sampling.h"

namespace gyre::cuda {

bool CudaBackend::fed_steps_begin(int token, int pos) {
  GYRE_CHECK(!capturing_ && !fed_, "internal: fed steps begun twice");
  static const bool enabled = [] {  // GYRE_CUDA_FED=0: step by step, for comparisons
    const char* e = std::getenv("GYRE_CUDA_FED");
    return e == nullptr || std::string(e) != "0";
  }();
  if (!enabled || !graphs_enabled_) return false;
  if (!fed_ring_) {
    void* host = nullptr;
    GYRE_CUDA_CHECK(cudaHostAlloc(&host, kFedRing * sizeof(int32_t), cudaHostAllocMapped));
    fed_ring_ = std::shared_ptr<void>(host, [](void* q) { (void)cudaFreeHost(q); });
    void* dev = nullptr;
    GYRE_CUDA_CHECK(cudaHostGetDevicePointer(&dev, host, 0));
    fed_ring_device_ = static_cast<int32_t*>(dev);
    fed_words_ = device_alloc(16, "fed decode steps");
    GYRE_CUDA_CHECK(cudaMemsetAsync(fed_words_.get(), 0, 16, stream_));
    for (cudaEvent_t& e : fed_events_)
      GYRE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  const int32_t values[3] = {token, pos, pos};  // token, positions[0], pos0
  StagedInts* const inputs[3] = {&tokens_, &positions_, &pos0_};
  for (int i = 0; i < 3; ++i) {
    StagedInts& s = *inputs[i];
    reserve_staging(s, 1);
    GYRE_CUDA_CHECK(cudaEventSynchronize(s.copied));
    *static_cast<int32_t*>(s.pinned.get()) = values[i];
    GYRE_CUDA_CHECK(
        cudaMemcpyAsync(s.device.get(), s.pinned.get(), 4, cudaMemcpyHostToDevice, stream_));
    GYRE_CUDA_CHECK(cudaEventRecord(s.copied, stream_));
    s.valid = false;
  }
  fed_ = true;
  return true;
}

void CudaBackend::fed_greedy(const Tensor& logits) {
  GYRE_CHECK(fed_, "internal: fed_greedy outside fed steps");
  GYRE_CHECK(logits.dtype == DType::F16 && logits.rows == 1, "fed greedy pick of ", logits.rows,
             " rows");
  GreedyFeedArgs a;
  a.logits = static_cast<const half*>(logits.data);
  a.vocab = static_cast<int>(logits.cols);
  a.best = static_cast<unsigned long long*>(fed_words_.get());
  a.done = reinterpret_cast<unsigned int*>(a.best + 1);
  a.token = static_cast<int32_t*>(tokens_.device.get());
  a.position = static_cast<int32_t*>(positions_.device.get());
  a.pos0 = static_cast<int32_t*>(pos0_.device.get());
  a.ring = fed_ring_device_;
  a.ring_mask = kFedRing - 1;
  greedy_feed(a, stream_);
}

void CudaBackend::fed_step_launched(int pos) {
  ++fed_steps_;
  GYRE_CUDA_CHECK(cudaEventRecord(fed_events_[pos & (kFedRing - 1)], stream_));
}

int CudaBackend::fed_result(int pos) {
  GYRE_CUDA_CHECK(cudaEventSynchronize(fed_events_[pos & (kFedRing - 1)]));
  const int id = static_cast<volatile int32_t*>(fed_ring_.get())[pos & (kFedRing - 1)];
  GYRE_CHECK(id >= 0, "every logit is NaN");
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
