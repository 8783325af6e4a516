// A generation request and the scheduler's record of it.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/kv_pages.h"

namespace gyre {

enum class SeqState { kWaiting, kRunning, kFinished, kCancelled };
enum class SeqFinish { kNone, kLength, kStop, kCancelled };

struct Request {
  SeqId id = 0;                      // caller-chosen, unique among the scheduler's sequences
  std::vector<int32_t> prompt;       // non-empty token ids
  int max_tokens = 1;                // tokens to generate at most (>= 1)
  int priority = 0;                  // higher runs first; equal priorities run in arrival order
  std::vector<int32_t> stop_tokens;  // e.g. EOS ids; a sampled stop token ends the sequence
};

// One sequence: the uniform view is `tokens` = prompt then generated tokens, of which the first
// num_computed have their KV in the cache. Every step runs tokens[num_computed, ...): a prompt
// chunk while prefilling, exactly the last sampled token while decoding. Preemption resets
// num_computed to 0 and the sequence recomputes prompt and generated tokens alike.
struct Sequence {
  Request request;
  SeqState state = SeqState::kWaiting;
  SeqFinish finish_reason = SeqFinish::kNone;
  std::vector<int32_t> tokens;
  int num_computed = 0;
  int64_t arrival = 0;  // scheduler-assigned admission order
  int num_preemptions = 0;
  int cached_prompt_tokens = 0;  // tokens taken from the prefix cache at the last admission

  int prompt_len() const { return int(request.prompt.size()); }
  int num_generated() const { return int(tokens.size()) - prompt_len(); }
  // Generated tokens (a stop token that ended the sequence is included, last).
  std::vector<int32_t> output() const {
    return std::vector<int32_t>(tokens.begin() + prompt_len(), tokens.end());
  }
  // Tokens still to run before the next logits are available.
  int pending() const { return int(tokens.size()) - num_computed; }
};

}  // namespace gyre
