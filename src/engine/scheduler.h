// Continuous-batching scheduler: decides, step by step, which tokens of which sequences run
// together, on top of the paged KV cache (kv_pages.h). Host only; single-threaded.
//
// Loop:  plan = schedule();  backend runs plan (copies, then the batch);  commit(plan, sampled).
//
// Policy of one step (budget = max_step_tokens, at most max_batch sequences):
//  1. Decodes: every running sequence with exactly one pending token gets it, in (priority,
//     arrival) order. When no page is left, the lowest-ranked running sequence not yet in this
//     step is preempted (pages released, requeued to recompute later; maybe itself).
//  2. Chunked prefill: partially prefilled running sequences, then waiting ones (same order),
//     each gets min(pending, budget left) tokens, shrunk to the pages available, so a long
//     prompt is spread over steps and never delays decodes. A waiting sequence first maps the
//     cached pages of its prompt prefix (not recomputed). A waiting sequence that does not fit
//     blocks the ones behind it (first come, first served: big requests never starve).
//  Full pages are published to the prefix cache at commit (when their KV exists), so later
//  requests with the same prefix reuse them; finished sequences' pages stay cached until evicted.
#pragma once
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/kv_pages.h"
#include "engine/sequence.h"

namespace gyre {

struct SchedulerConfig {
  int max_step_tokens = 2048;  // tokens run per step, all sequences together
  int max_batch = 64;          // sequences per step; also the most running at once
  int max_seq_len = 0;         // prompt + max_tokens bound per request; 0: only the KV pool
};

// What one sequence runs in a step.
struct SeqStep {
  SeqId id = 0;
  std::vector<int32_t> tokens;     // token ids to run
  std::vector<int32_t> positions;  // their positions: context_len - tokens.size() ...
  std::vector<PageId> page_table;  // pages covering positions [0, context_len)
  int context_len = 0;             // tokens attention sees after this step (cached + new)
  int cached_tokens = 0;           // leading prompt tokens reused from the prefix cache (first
                                   // chunk after admission only; already in page_table)
  bool need_logits = false;        // last prompt chunk or decode: sample a token from its last row
};

struct BatchPlan {
  int64_t step = -1;
  std::vector<PageCopy> copies;  // copy-on-write, to run in order before the batch
  std::vector<SeqStep> seqs;     // decodes first, then prefill chunks
  std::vector<SeqId> preempted;  // sequences sent back to waiting while planning
  int num_tokens = 0;
  bool empty() const { return seqs.empty(); }
};

// The same plan as flat arrays, the layout a batched attention kernel takes (one upload each).
// Row r is the r-th token of the step over all sequences in plan order.
struct FlatBatch {
  std::vector<int32_t> tokens;        // [rows]
  std::vector<int32_t> positions;     // [rows]
  std::vector<int64_t> slots;         // [rows] KV slot written: page * page_size + pos % page_size
  std::vector<int32_t> seq_starts;    // [seqs + 1] first row of each sequence, then rows
  std::vector<int32_t> context_lens;  // [seqs]
  int max_pages = 0;                  // row length of page_tables
  std::vector<int32_t> page_tables;   // [seqs][max_pages], padded with -1
  std::vector<int32_t> logit_rows;    // rows whose logits are sampled, in plan order
};
FlatBatch flatten(const BatchPlan& plan, int page_size);

// The token sampled for a sequence whose SeqStep had need_logits.
struct StepResult {
  SeqId id = 0;
  int32_t token = 0;
};

// What commit() did to one sequence that sampled a token.
struct SeqUpdate {
  SeqId id = 0;
  int32_t token = 0;
  bool finished = false;
  SeqFinish reason = SeqFinish::kNone;
};

struct SchedulerStats {
  int64_t steps = 0;
  int64_t prefill_tokens = 0;  // prompt (or recomputed) tokens run
  int64_t decode_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // tokens skipped thanks to the prefix cache
  int64_t preemptions = 0;
  int64_t finished = 0;
  int64_t cancelled = 0;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, KvPageManager& kv);

  // Queues a request; throws gyre::Error if it is malformed or could never fit the KV pool.
  void add_request(Request request);
  // Cancels a waiting or running sequence (its pages are released; if it is in the step being
  // executed, at that step's commit). Returns false if unknown or already done.
  bool cancel(SeqId id);

  // Plans the next step. Call commit() with its results before planning again.
  BatchPlan schedule();
  // Applies a step: the KV of every planned token now exists; `results` holds one sampled token
  // per planned sequence with need_logits (cancelled ones may be omitted and are ignored).
  std::vector<SeqUpdate> commit(const BatchPlan& plan, std::span<const StepResult> results);

  // Waiting or running sequences remain.
  bool has_unfinished() const { return !waiting_.empty() || !running_.empty(); }
  int num_waiting() const { return int(waiting_.size()); }
  int num_running() const { return int(running_.size()); }
  const Sequence& sequence(SeqId id) const;
  // Forgets a finished or cancelled sequence's record.
  void erase(SeqId id);
  const SchedulerStats& stats() const { return stats_; }
  const SchedulerConfig& config() const { return config_; }

 private:
  Sequence& seq_at(SeqId id);
  bool ranks_before(SeqId a, SeqId b) const;
  void sort_by_rank(std::vector<SeqId>& ids) const;
  SeqId pick_victim(const std::unordered_set<SeqId>& scheduled) const;
  void preempt(SeqId id, BatchPlan& plan);
  void add_step(Sequence& s, int n, BatchPlan& plan);
  bool schedule_prefill(Sequence& s, int budget, const std::unordered_set<SeqId>& scheduled,
                        BatchPlan& plan);
  void finish(Sequence& s, SeqFinish reason);

  SchedulerConfig config_;
  KvPageManager& kv_;
  std::unordered_map<SeqId, Sequence> seqs_;
  std::vector<SeqId> waiting_;
  std::vector<SeqId> running_;
  int64_t next_arrival_ = 0;
  int64_t next_step_ = 0;
  bool in_flight_ = false;
  std::unordered_set<SeqId> in_flight_ids_;
  SchedulerStats stats_;
};

}  // namespace gyre
