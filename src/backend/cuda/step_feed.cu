// The pick of a fed decode step (CudaBackend::fed_pick) becomes the next step's token and position
// on the device and is published to the host through mapped memory, so that the host can enqueue
// the next step before this one ends: greedy (the argmax of one FP16 logits row, here) or sampled
// (sampling.cu's kernel, then feed_sampled_kernel).
#include <algorithm>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/sampling.h"
#include "backend/cuda/sampling_keys.cuh"

namespace gyre::cuda {

namespace {

constexpr int kFeedThreads = 256;
constexpr int kFeedBlocks = 64;  // at most

// id -1: every logit is NaN (the host stops and reports it).
__device__ void publish(const FeedTargets& to, int id) {
  const int pos = *to.pos0;
  *to.token = id < 0 ? 0 : id;  // a valid row for the next step's embedding
  *to.position = pos + 1;
  *to.pos0 = pos + 1;
  *reinterpret_cast<volatile int32_t*>(to.ring + (pos & to.ring_mask)) = id;
  __threadfence_system();
}

__global__ void __launch_bounds__(kFeedThreads) feed_greedy_kernel(GreedyFeedArgs a) {
  pdl_wait();  // the logits are the previous kernel's output
  __shared__ unsigned long long warp_best[kFeedThreads / 32];
  __shared__ bool last;
  const unsigned long long b =
      sample_keys::block_best(a.logits, a.vocab, blockIdx.x * kFeedThreads + threadIdx.x,
                              gridDim.x * kFeedThreads, warp_best);
  if (threadIdx.x == 0) {
    if (b != 0) atomicMax(a.best, b);
    __threadfence();  // this block's maximum before its count
    last = atomicAdd(a.done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last || threadIdx.x != 0) return;
  // The last block to finish: every other block's maximum is in *best. Both words go back to zero
  // for the next step.
  __threadfence();
  const unsigned long long best = atomicExch(a.best, 0ull);
  *a.done = 0;
  publish(a.to, best == 0 ? -1 : sample_keys::id_of_best(best));
}

__global__ void feed_sampled_kernel(const SampleRowOut* out, FeedTargets to) {
  pdl_wait();
  publish(to, out->error == kSampleOk ? out->id : -1);
}

}  // namespace

void feed_greedy(const GreedyFeedArgs& a, cudaStream_t s) {
  const int blocks = std::min(kFeedBlocks, (a.vocab + 8 * kFeedThreads - 1) / (8 * kFeedThreads));
  launch(feed_greedy_kernel, dim3(static_cast<unsigned>(std::max(blocks, 1))), dim3(kFeedThreads),
         0, s, a);
  GYRE_CUDA_LAUNCHED();
}

void feed_sampled(const SampleRowOut* out, const FeedTargets& to, cudaStream_t s) {
  launch(feed_sampled_kernel, dim3(1), dim3(1), 0, s, out, to);
  GYRE_CUDA_LAUNCHED();
}

}  // namespace gyre::cuda
