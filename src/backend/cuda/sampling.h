// Token sampling on the GPU (sampling.cu): one block per logits row, no sort of the vocabulary.
// Semantics: backend/sample_host.h (the host reference), minus penalties and typical_p, which
// the backend leaves to the host reference (cuda_sample.cc).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace gyre::cuda {

constexpr int kSampleMaxTop = 20;

struct SampleRowParams {
  float inv_temp = 0.0f;  // 1 / temperature; 0: greedy
  int top_k = 0;          // 0: off
  float top_p = 1.0f;     // >= 1: off
  float min_p = 0.0f;     // <= 0: off
  double uniform = 0.0;   // [0, 1)
  int top_n = 0;          // best raw-logit log-probabilities wanted, 0..kSampleMaxTop
  int want_logprob = 0;   // the chosen id's log-probability
  int skip = 0;           // the host samples this row: write nothing
};

enum SampleRowError : int { kSampleOk = 0, kSampleAllNan = 1, kSampleNoFinite = 2 };

struct SampleRowOut {
  int id = -1;
  int error = kSampleOk;
  float logprob = 0.0f;
  int n_top = 0;
  int top_ids[kSampleMaxTop];
  float top_logprobs[kSampleMaxTop];
};

// Implementation choices (bits of `mode`), switchable to compare them on the device
// (GYRE_CUDA_SAMPLE_MODE). Measured on an H100 (bench/NOTES.md), one row of 128256, top-p 0.95:
// scalar loads 366 us, 16-byte loads 278 us. (Combining the histogram atomics per warp with
// match_any/reduce_add was tried and removed: 930 us.)
constexpr int kSampleVectorLoads = 1;  // 16-byte loads where the row is 16-byte aligned
// The first pass (the best token of each row) over many blocks before the one block per row
// (session 12, H100, one row of 128256, greedy: 18.5-19.6 us in one block).
constexpr int kSampleSpreadArgmax = 2;
constexpr int kSampleDefaultMode = kSampleVectorLoads | kSampleSpreadArgmax;

// Samples rows [0, rows) of FP16 logits (row r at logits + r * ld, `vocab` entries each).
// best: `rows` zeroed words of device memory, left zeroed (the spread first pass merges into
// them); null: no spread first pass.
// params_slot (fed steps, one row): the row's parameters are params[*params_slot & slot_mask] (a
// ring the host fills ahead) instead of params[row].
void sample_rows(const half* logits, int64_t ld, int vocab, int rows, const SampleRowParams* params,
                 SampleRowOut* out, int mode, cudaStream_t s, unsigned long long* best = nullptr,
                 const int32_t* params_slot = nullptr, int slot_mask = 0);

// Fed decode steps (step_feed.cu): where a step's pick goes. token = id, position and pos0 advance
// by one (the next step's inputs), and ring[pos0 & ring_mask] (host-mapped) = id, -1 when every
// logit is NaN or nothing could be sampled.
struct FeedTargets {
  int32_t* token = nullptr;
  int32_t* position = nullptr;
  int32_t* pos0 = nullptr;
  int32_t* ring = nullptr;  // device address of host-mapped memory
  int ring_mask = 0;        // ring size - 1 (a power of two)
};
// The greedy pick: the argmax of `logits` (one row; lowest id on ties).
struct GreedyFeedArgs {
  const half* logits = nullptr;
  int vocab = 0;
  unsigned long long* best = nullptr;  // one zeroed word, left zeroed
  unsigned int* done = nullptr;        // one zeroed counter, left zeroed
  FeedTargets to;
};
void feed_greedy(const GreedyFeedArgs& a, cudaStream_t s);
// The sampled pick: out, written by sample_rows with params_slot (below).
void feed_sampled(const SampleRowOut* out, const FeedTargets& to, cudaStream_t s);

}  // namespace gyre::cuda
