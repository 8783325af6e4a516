// The greedy pick of a fed decode step (CudaBackend::fed_greedy): the argmax of one FP16 logits row
// becomes the next step's token and position on the device, and is published to the host through
// mapped memory, so that the host can enqueue the next step before this one ends.
#include <algorithm>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/sampling.h"
#include "backend/cuda/sampling_keys.cuh"

namespace gyre::cuda {

namespace {

constexpr int kFeedThreads = 256;
constexpr int kFeedBlocks = 64;  // at most

__global__ void __launch_bounds__(kFeedThreads) greedy_feed_kernel(GreedyFeedArgs a) {
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
  const int id = best == 0 ? -1 : sample_keys::id_of_best(best);  // -1: every logit is NaN
  const int pos = *a.pos0;
  *a.token = id < 0 ? 0 : id;  // a valid row for the next step's embedding; the host stops anyway
  *a.position = pos + 1;
  *a.pos0 = pos + 1;
  *reinterpret_cast<volatile int32_t*>(a.ring + (pos & a.ring_mask)) = id;
  __threadfence_system();
}

}  // namespace

void greedy_feed(const GreedyFeedArgs& a, cudaStream_t s) {
  const int blocks = std::min(kFeedBlocks, (a.vocab + 8 * kFeedThreads - 1) / (8 * kFeedThreads));
  launch(greedy_feed_kernel, dim3(static_cast<unsigned>(std::max(blocks, 1))), dim3(kFeedThreads),
         0, s, a);
  GYRE_CUDA_LAUNCHED();
}

}  // namespace gyre::cuda
