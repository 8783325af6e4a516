#include "engine/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace gyre {

Scheduler::Scheduler(const SchedulerConfig& config, KvPageManager& kv) : config_(config), kv_(kv) {
  GYRE_CHECK(config.max_batch >= 1, "scheduler: max_batch must be at least 1, got ",
             config.max_batch);
  // Every running sequence must be able to decode every step, or the lowest-ranked would starve.
  GYRE_CHECK(config.max_step_tokens >= config.max_batch, "scheduler: max_step_tokens (",
             config.max_step_tokens, ") must be at least max_batch (", config.max_batch, ")");
  GYRE_CHECK(config.max_seq_len >= 0, "scheduler: negative max_seq_len ", config.max_seq_len);
}

Sequence& Scheduler::seq_at(SeqId id) {
  auto it = seqs_.find(id);
  GYRE_CHECK(it != seqs_.end(), "scheduler: unknown sequence ", id);
  return it->second;
}

const Sequence& Scheduler::sequence(SeqId id) const {
  auto it = seqs_.find(id);
  GYRE_CHECK(it != seqs_.end(), "scheduler: unknown sequence ", id);
  return it->second;
}

void Scheduler::add_request(Request request) {
  const SeqId id = request.id;
  GYRE_CHECK(!seqs_.count(id), "request id ", id, " is already in use");
  GYRE_CHECK(!request.prompt.empty(), "request ", id, ": empty prompt");
  GYRE_CHECK(request.max_tokens >= 1, "request ", id, ": max_tokens must be at least 1, got ",
             request.max_tokens);
  for (int32_t t : request.prompt) GYRE_CHECK(t >= 0, "request ", id, ": negative token id ", t);
  const int64_t total = int64_t(request.prompt.size()) + request.max_tokens;
  GYRE_CHECK(config_.max_seq_len == 0 || total <= config_.max_seq_len, "request ", id,
             ": prompt plus max_tokens (", total, ") exceeds the context limit ",
             config_.max_seq_len);
  // The last sampled token is never run, so total - 1 positions need KV.
  const int64_t pages = (total - 1 + kv_.page_size() - 1) / kv_.page_size();
  GYRE_CHECK(pages <= kv_.num_pages(), "request ", id, ": needs ", pages,
             " KV pages, more than the whole cache (", kv_.num_pages(), ")");
  Sequence s;
  s.tokens = request.prompt;
  s.request = std::move(request);
  s.arrival = next_arrival_++;
  seqs_.emplace(id, std::move(s));
  waiting_.push_back(id);
}

bool Scheduler::cancel(SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  Sequence& s = it->second;
  if (s.state == SeqState::kWaiting) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
  } else if (s.state == SeqState::kRunning) {
    running_.erase(std::find(running_.begin(), running_.end(), id));
    // The executing step may still write its pages; commit() releases them.
    if (!in_flight_ids_.count(id)) kv_.release(id);
  } else {
    return false;
  }
  s.state = SeqState::kCancelled;
  s.finish_reason = SeqFinish::kCancelled;
  stats_.cancelled++;
  return true;
}

void Scheduler::erase(SeqId id) {
  const Sequence& s = sequence(id);
  GYRE_CHECK(s.state == SeqState::kFinished || s.state == SeqState::kCancelled,
             "scheduler: sequence ", id, " is still active");
  GYRE_CHECK(!in_flight_ids_.count(id), "scheduler: sequence ", id, " is in the executing step");
  seqs_.erase(id);
}

bool Scheduler::ranks_before(SeqId a, SeqId b) const {
  const Sequence& sa = seqs_.at(a);
  const Sequence& sb = seqs_.at(b);
  if (sa.request.priority != sb.request.priority) return sa.request.priority > sb.request.priority;
  return sa.arrival < sb.arrival;
}

void Scheduler::sort_by_rank(std::vector<SeqId>& ids) const {
  std::sort(ids.begin(), ids.end(), [this](SeqId a, SeqId b) { return ranks_before(a, b); });
}

SeqId Scheduler::pick_victim(const std::unordered_set<SeqId>& scheduled) const {
  SeqId victim = -1;
  bool found = false;
  for (SeqId id : running_) {
    if (scheduled.count(id)) continue;
    if (!found || ranks_before(victim, id)) victim = id;
    found = true;
  }
  GYRE_CHECK(found, "scheduler: no preemption candidate (internal error)");
  return victim;
}

void Scheduler::preempt(SeqId id, BatchPlan& plan) {
  Sequence& s = seq_at(id);
  kv_.release(id);
  s.num_computed = 0;
  s.cached_prompt_tokens = 0;
  s.num_preemptions++;
  s.state = SeqState::kWaiting;
  running_.erase(std::find(running_.begin(), running_.end(), id));
  waiting_.push_back(id);
  plan.preempted.push_back(id);
  stats_.preemptions++;
}

void Scheduler::add_step(Sequence& s, int n, BatchPlan& plan) {
  const SeqId id = s.request.id;
  SeqStep st;
  st.id = id;
  st.tokens.assign(s.tokens.begin() + s.num_computed, s.tokens.begin() + s.num_computed + n);
  for (int i = 0; i < n; ++i) st.positions.push_back(s.num_computed + i);
  st.context_len = s.num_computed + n;
  const auto& table = kv_.page_table(id);
  const size_t pages = (size_t(st.context_len) + kv_.page_size() - 1) / kv_.page_size();
  st.page_table.assign(table.begin(), table.begin() + pages);
  st.need_logits = st.context_len == int(s.tokens.size());
  plan.num_tokens += n;
  plan.seqs.push_back(std::move(st));
}

// Largest chunk <= want whose pages are available now (pages_needed is monotone in n).
static int largest_fitting_chunk(const KvPageManager& kv, SeqId id, int want) {
  int lo = 0, hi = want;
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (kv.pages_needed(id, mid) <= kv.available_pages())
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

bool Scheduler::schedule_prefill(Sequence& s, int budget,
                                 const std::unordered_set<SeqId>& scheduled, BatchPlan& plan) {
  const SeqId id = s.request.id;
  const bool admitting = s.state == SeqState::kWaiting;
  if (admitting) {
    kv_.create(id);
    s.num_computed = kv_.match_prefix(id, s.tokens);
    s.cached_prompt_tokens = s.num_computed;
  }
  int chunk = largest_fitting_chunk(kv_, id, std::min(s.pending(), budget));
  // A running sequence that cannot move at all takes pages from lower-ranked unscheduled ones;
  // a waiting one never preempts (it waits for pages instead).
  while (chunk == 0 && !admitting) {
    const SeqId victim = pick_victim(scheduled);
    if (victim == id) break;
    preempt(victim, plan);
    chunk = largest_fitting_chunk(kv_, id, std::min(s.pending(), budget));
  }
  if (chunk == 0) {
    if (admitting) {
      kv_.release(id);
      s.num_computed = 0;
      s.cached_prompt_tokens = 0;
    }
    return false;
  }
  GYRE_CHECK(kv_.reserve(id, chunk), "scheduler: reservation failed (internal error)");
  if (admitting) {
    s.state = SeqState::kRunning;
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
    running_.push_back(id);
    stats_.cached_prompt_tokens += s.cached_prompt_tokens;
  }
  add_step(s, chunk, plan);
  if (admitting) plan.seqs.back().cached_tokens = s.cached_prompt_tokens;
  stats_.prefill_tokens += chunk;
  return true;
}

BatchPlan Scheduler::schedule() {
  GYRE_CHECK(!in_flight_, "scheduler: schedule() called again before commit()");
  BatchPlan plan;
  plan.step = next_step_++;
  int budget = config_.max_step_tokens;
  const size_t max_batch = size_t(config_.max_batch);
  std::unordered_set<SeqId> scheduled;

  // 1. Decodes, best-ranked first; preempt the worst-ranked unscheduled sequence for pages.
  sort_by_rank(running_);
  const std::vector<SeqId> decode_order = running_;
  for (SeqId id : decode_order) {
    if (plan.seqs.size() >= max_batch || budget == 0) break;
    Sequence& s = seq_at(id);
    if (s.state != SeqState::kRunning || s.pending() != 1) continue;
    bool preempted_self = false;
    while (!kv_.reserve(id, 1)) {
      const SeqId victim = pick_victim(scheduled);
      preempt(victim, plan);
      if (victim == id) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) continue;
    add_step(s, 1, plan);
    scheduled.insert(id);
    budget--;
    stats_.decode_tokens++;
  }

  // 2. Prefill chunks: partially prefilled running sequences, then waiting ones.
  std::vector<SeqId> order;
  for (SeqId id : running_)
    if (!scheduled.count(id)) order.push_back(id);
  sort_by_rank(order);
  const size_t first_waiting = order.size();
  std::vector<SeqId> waiting = waiting_;
  sort_by_rank(waiting);
  order.insert(order.end(), waiting.begin(), waiting.end());
  for (size_t i = 0; i < order.size(); ++i) {
    if (plan.seqs.size() >= max_batch || budget == 0) break;
    const SeqId id = order[i];
    Sequence& s = seq_at(id);
    const bool admitting = i >= first_waiting;
    if (!admitting && s.state != SeqState::kRunning) continue;  // preempted in this loop
    if (admitting) {
      // Memory is short if this one was just preempted: admitting it now would only churn, and
      // no one behind it may jump ahead (first come, first served).
      const bool just_preempted =
          std::find(plan.preempted.begin(), plan.preempted.end(), id) != plan.preempted.end();
      if (just_preempted || running_.size() >= max_batch) break;
    }
    if (!schedule_prefill(s, budget, scheduled, plan)) {
      if (admitting) break;
      continue;
    }
    scheduled.insert(id);
    budget -= int(plan.seqs.back().tokens.size());
  }

  plan.copies = kv_.take_copies();
  in_flight_ = true;
  in_flight_ids_ = std::move(scheduled);
  stats_.steps++;
  return plan;
}

void Scheduler::finish(Sequence& s, SeqFinish reason) {
  s.state = SeqState::kFinished;
  s.finish_reason = reason;
  kv_.release(s.request.id);
  running_.erase(std::find(running_.begin(), running_.end(), s.request.id));
  stats_.finished++;
}

std::vector<SeqUpdate> Scheduler::commit(const BatchPlan& plan,
                                         std::span<const StepResult> results) {
  GYRE_CHECK(in_flight_ && plan.step == next_step_ - 1,
             "scheduler: commit() does not match the last schedule()");
  // Validate everything before changing anything, so a bad call leaves the state intact.
  std::unordered_map<SeqId, int32_t> sampled;
  for (const StepResult& r : results) {
    GYRE_CHECK(sampled.emplace(r.id, r.token).second, "commit: two tokens for sequence ", r.id);
    GYRE_CHECK(r.token >= 0, "commit: negative token id ", r.token, " for sequence ", r.id);
  }
  size_t used = 0;
  for (const SeqStep& st : plan.seqs) {
    GYRE_CHECK(in_flight_ids_.count(st.id), "commit: sequence ", st.id, " was not planned");
    const Sequence& s = seqs_.at(st.id);
    const bool has = sampled.count(st.id) != 0;
    used += has;
    if (s.state == SeqState::kCancelled) continue;
    GYRE_CHECK(
        st.context_len == s.num_computed + int(st.tokens.size()) &&
            std::equal(st.tokens.begin(), st.tokens.end(), s.tokens.begin() + s.num_computed),
        "commit: plan for sequence ", st.id, " was altered");
    GYRE_CHECK(has == st.need_logits, "commit: sequence ", st.id,
               st.need_logits ? " needs a sampled token" : " must not get a token (mid-prefill)");
  }
  GYRE_CHECK(used == sampled.size(), "commit: a token was given for a sequence not in the step");

  std::vector<SeqUpdate> updates;
  for (const SeqStep& st : plan.seqs) {
    Sequence& s = seqs_.at(st.id);
    if (s.state == SeqState::kCancelled) {
      kv_.release(st.id);  // deferred from cancel()
      continue;
    }
    kv_.append(st.id, st.tokens);
    s.num_computed += int(st.tokens.size());
    if (!st.need_logits) continue;
    SeqUpdate u{st.id, sampled.at(st.id), false, SeqFinish::kNone};
    s.tokens.push_back(u.token);
    const auto& stops = s.request.stop_tokens;
    if (std::find(stops.begin(), stops.end(), u.token) != stops.end())
      u.reason = SeqFinish::kStop;
    else if (s.num_generated() >= s.request.max_tokens)
      u.reason = SeqFinish::kLength;
    if (u.reason != SeqFinish::kNone) {
      u.finished = true;
      finish(s, u.reason);
    }
    updates.push_back(u);
  }
  in_flight_ = false;
  in_flight_ids_.clear();
  return updates;
}

FlatBatch flatten(const BatchPlan& plan, int page_size) {
  FlatBatch f;
  f.seq_starts.push_back(0);
  for (const SeqStep& st : plan.seqs) {
    f.max_pages = std::max(f.max_pages, int(st.page_table.size()));
    for (size_t i = 0; i < st.tokens.size(); ++i) {
      const int32_t pos = st.positions[i];
      f.tokens.push_back(st.tokens[i]);
      f.positions.push_back(pos);
      f.slots.push_back(int64_t(st.page_table.at(pos / page_size)) * page_size + pos % page_size);
    }
    if (st.need_logits) f.logit_rows.push_back(int32_t(f.tokens.size()) - 1);
    f.seq_starts.push_back(int32_t(f.tokens.size()));
    f.context_lens.push_back(st.context_len);
  }
  f.page_tables.assign(plan.seqs.size() * size_t(f.max_pages), -1);
  for (size_t i = 0; i < plan.seqs.size(); ++i)
    std::copy(plan.seqs[i].page_table.begin(), plan.seqs[i].page_table.end(),
              f.page_tables.begin() + i * f.max_pages);
  return f;
}

}  // namespace gyre
