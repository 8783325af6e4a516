// The engine's loop thread: requests come in through a bounded queue, the scheduler plans each
// step, the transformer runs it as one batch over the paged KV cache, and every sequence that
// got logits samples, streams and maybe ends (engine_request.h).
#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "engine/engine_request.h"
#include "engine/kv_pages.h"
#include "engine/scheduler.h"
#include "engine/transformer.h"

namespace gyre {

namespace {
using Clock = std::chrono::steady_clock;
constexpr double kRateWindowS = 5.0;  // tokens_per_s looks this far back
}  // namespace

struct Engine::Impl {
  Impl(const LoadedModel& model, Backend& backend, const EngineConfig& config);
  ~Impl();

  void loop();
  bool run_step();  // false when the scheduler had nothing it could run
  void take_new_work(std::vector<std::unique_ptr<EngineRequest>>& added,
                     std::vector<uint64_t>& cancelled);
  // Ends a request with a final event and forgets it (it must be out of the scheduler, or
  // finished/cancelled there and not in flight).
  void end_request(uint64_t id, const TokenEvent& final_event);
  void fail_in_flight(const BatchPlan& plan, const std::string& error);
  void reset_scheduler(const std::string& error);
  void publish_stats(uint64_t new_tokens);

  const LoadedModel& model;
  Backend& backend;
  EngineConfig cfg;
  int max_seq = 0;
  int vocab = 0;
  std::vector<int> model_end_ids;  // config and tokenizer EOS ids
  std::unique_ptr<Transformer> transformer;
  std::unique_ptr<PagedKvCache> kv;
  std::unique_ptr<KvPageManager> pages;
  std::unique_ptr<Scheduler> sched;
  std::vector<SampleRequest> sample_requests;  // one per logits row of a step, reused
  std::vector<SampleResult> sample_results;
  uint64_t preemptions_before_reset = 0;
  int ended_unpublished = 0;  // requests ended since the last publish_stats

  // Loop thread only.
  std::unordered_map<uint64_t, std::unique_ptr<EngineRequest>> active;

  // Shared, under mu.
  mutable std::mutex mu;
  std::condition_variable wake;      // the loop: new work, cancels or stop
  std::condition_variable finished;  // drain(): outstanding reached 0
  std::deque<std::unique_ptr<EngineRequest>> incoming;
  std::vector<uint64_t> cancels;
  bool stopping = false, accepting = true;
  uint64_t next_id = 1;
  int outstanding = 0;  // accepted requests without their final event yet
  int sched_waiting = 0;
  EngineStats stats;
  std::deque<std::pair<Clock::time_point, uint64_t>> rate;  // (time, generated_tokens so far)

  std::thread thread;
};

Engine::Impl::Impl(const LoadedModel& m, Backend& b, const EngineConfig& c)
    : model(m), backend(b), cfg(c) {
  GYRE_CHECK(c.max_batch >= 1, "engine: max_batch must be at least 1, got ", c.max_batch);
  GYRE_CHECK(c.max_queue >= 1, "engine: max_queue must be at least 1, got ", c.max_queue);
  GYRE_CHECK(c.max_step_tokens >= c.max_batch, "engine: max_step_tokens (", c.max_step_tokens,
             ") must be at least max_batch (", c.max_batch, ")");
  GYRE_CHECK(c.page_size >= 1 && c.page_size <= 4096, "engine: page_size must be 1..4096, got ",
             c.page_size);
  GYRE_CHECK(c.max_seq_len >= 1, "engine: max_seq_len must be positive, got ", c.max_seq_len);
  GYRE_CHECK(c.num_pages >= 0, "engine: negative num_pages ", c.num_pages);
  GYRE_CHECK(m.tokenizer != nullptr, "engine: the model has no tokenizer");
  max_seq =
      m.config.max_seq_len > 0 ? std::min(c.max_seq_len, m.config.max_seq_len) : c.max_seq_len;
  vocab = m.config.vocab_size;
  const int64_t pages_per_seq = (max_seq + c.page_size - 1) / c.page_size;
  if (cfg.num_pages == 0) {
    GYRE_CHECK(pages_per_seq * c.max_batch <= (int64_t{1} << 30), "engine: too many KV pages");
    cfg.num_pages = static_cast<int>(pages_per_seq * c.max_batch);
  }
  model_end_ids = m.config.eos_ids;
  for (int id : m.tokenizer->eos_ids()) model_end_ids.push_back(id);
  transformer = std::make_unique<Transformer>(m.config, m.weights, b, max_seq, false);
  kv = transformer->new_paged_kv_cache(cfg.num_pages, cfg.page_size);
  pages = std::make_unique<KvPageManager>(cfg.num_pages, cfg.page_size);
  sched =
      std::make_unique<Scheduler>(SchedulerConfig{cfg.max_step_tokens, cfg.max_batch, 0}, *pages);
  stats.kv_pages_total = cfg.num_pages;
  thread = std::thread([this] { loop(); });
}

Engine::Impl::~Impl() {
  {
    std::lock_guard<std::mutex> lock(mu);
    stopping = true;
    accepting = false;
  }
  wake.notify_all();
  if (thread.joinable()) thread.join();
}

void Engine::Impl::take_new_work(std::vector<std::unique_ptr<EngineRequest>>& added,
                                 std::vector<uint64_t>& cancelled) {
  while (!incoming.empty()) {
    added.push_back(std::move(incoming.front()));
    incoming.pop_front();
  }
  cancelled.swap(cancels);
}

void Engine::Impl::loop() {
  bool idle_plan = false;  // the last plan was empty: wait for news instead of planning again
  for (;;) {
    std::vector<std::unique_ptr<EngineRequest>> added;
    std::vector<uint64_t> cancelled;
    {
      std::unique_lock<std::mutex> lock(mu);
      wake.wait(lock, [&] {
        return stopping || !incoming.empty() || !cancels.empty() ||
               (!idle_plan && sched->has_unfinished());
      });
      if (stopping) break;
      take_new_work(added, cancelled);
    }
    idle_plan = false;
    for (auto& r : added) {
      const uint64_t id = r->id();
      Request req;
      req.id = static_cast<SeqId>(id);
      req.prompt.assign(r->prompt().begin(), r->prompt().end());
      req.max_tokens = r->token_limit();
      req.stop_tokens.assign(r->end_ids().begin(), r->end_ids().end());
      EngineRequest& ref = *r;
      active.emplace(id, std::move(r));
      try {
        sched->add_request(std::move(req));
      } catch (const std::exception& e) {
        end_request(id, ref.final_event(FinishReason::Length, e.what()));
      }
    }
    if (!added.empty()) {
      std::lock_guard<std::mutex> lock(mu);
      sched_waiting = sched->num_waiting();  // keeps submit()'s queue bound honest meanwhile
    }
    for (uint64_t id : cancelled) {
      auto it = active.find(id);
      if (it == active.end()) continue;  // unknown or already done
      sched->cancel(static_cast<SeqId>(id));
      {
        std::lock_guard<std::mutex> lock(mu);
        stats.requests_cancelled++;
      }
      end_request(id, it->second->final_event(FinishReason::Cancelled));
    }
    if (!sched->has_unfinished()) {
      publish_stats(0);
      continue;
    }
    try {
      idle_plan = !run_step();
    } catch (const std::exception& e) {
      reset_scheduler(std::string("engine step failed: ") + e.what());
    }
  }
  // Shutting down: whatever is left ends as cancelled.
  std::vector<std::unique_ptr<EngineRequest>> added;
  std::vector<uint64_t> cancelled;
  {
    std::lock_guard<std::mutex> lock(mu);
    take_new_work(added, cancelled);
  }
  for (auto& r : added) active.emplace(r->id(), std::move(r));
  std::vector<uint64_t> ids;
  for (auto& [id, r] : active) ids.push_back(id);
  for (uint64_t id : ids) {
    {
      std::lock_guard<std::mutex> lock(mu);
      stats.requests_cancelled++;
    }
    end_request(id, active.at(id)->final_event(FinishReason::Cancelled));
  }
  publish_stats(0);
}

bool Engine::Impl::run_step() {
  BatchPlan plan = sched->schedule();
  {
    std::lock_guard<std::mutex> lock(mu);
    sched_waiting = sched->num_waiting();  // admitted ones leave the queue now, not after the step
    stats.running = sched->num_running();
  }
  if (plan.empty()) {
    sched->commit(plan, {});
    publish_stats(0);
    return false;
  }
  std::vector<StepResult> results;
  std::vector<std::pair<uint64_t, SampledToken>> sampled;
  std::vector<SeqId> failed;
  try {
    for (const PageCopy& c : plan.copies) backend.copy_kv_page(*kv, c.src, c.dst, c.num_tokens);
    const FlatBatch fb = flatten(plan, cfg.page_size);
    PagedBatch pb;
    pb.rows = static_cast<int>(fb.tokens.size());
    pb.seqs = static_cast<int>(plan.seqs.size());
    pb.positions = fb.positions.data();
    pb.slots = fb.slots.data();
    pb.seq_starts = fb.seq_starts.data();
    pb.context_lens = fb.context_lens.data();
    pb.page_tables = fb.page_tables.data();
    pb.max_pages = fb.max_pages;
    pb.generation = static_cast<uint64_t>(plan.step) + 1;
    // The logits stay on the backend, which samples every row (only ids and the asked
    // log-probabilities come back).
    transformer->forward_batch(fb.tokens.data(), pb, *kv, fb.logit_rows.data(),
                               static_cast<int>(fb.logit_rows.size()), nullptr);
    sample_requests.clear();
    for (const SeqStep& st : plan.seqs)
      if (st.need_logits)
        sample_requests.push_back(active.at(static_cast<uint64_t>(st.id))->next_request());
    sample_results.assign(sample_requests.size(), SampleResult{});
    transformer->sample_logits(sample_requests.data(), static_cast<int>(sample_requests.size()),
                               sample_results.data());
  } catch (const std::exception& e) {
    fail_in_flight(plan, std::string("batched forward pass failed: ") + e.what());
    return true;
  }
  size_t row = 0;
  for (const SeqStep& st : plan.seqs) {
    const uint64_t id = static_cast<uint64_t>(st.id);
    EngineRequest& r = *active.at(id);
    if (st.cached_tokens > 0) r.set_cached_tokens(st.cached_tokens);
    if (!st.need_logits) continue;
    const SampleResult& res = sample_results[row++];
    try {
      SampledToken t = EngineRequest::sampled_token(res);
      results.push_back({st.id, t.token});
      sampled.emplace_back(id, std::move(t));
    } catch (const std::exception& e) {
      sched->cancel(st.id);  // in flight: its pages go at commit
      end_request(id, r.final_event(FinishReason::Length, e.what()));
      failed.push_back(st.id);
    }
  }
  const std::vector<SeqUpdate> updates = sched->commit(plan, results);
  for (SeqId id : failed) sched->erase(id);  // could not be erased while in flight
  uint64_t new_tokens = 0;
  for (size_t i = 0; i < updates.size(); ++i) {
    const SeqUpdate& u = updates[i];
    const uint64_t id = static_cast<uint64_t>(u.id);
    EngineRequest& r = *active.at(id);
    // updates follow the plan order, as do `sampled` (minus failed ones: look the id up).
    const auto it =
        std::find_if(sampled.begin(), sampled.end(), [&](const auto& p) { return p.first == id; });
    const TokenEvent e = r.accept(it->second, u.finished && u.reason == SeqFinish::kLength);
    ++new_tokens;
    if (e.done) {
      if (!u.finished) sched->cancel(u.id);  // a stop string: the scheduler did not know
      end_request(id, e);
    } else if (!r.deliver(e)) {
      sched->cancel(u.id);
      end_request(id, r.final_event(FinishReason::Cancelled, "the event callback failed"));
    }
  }
  publish_stats(new_tokens);
  return true;
}

void Engine::Impl::end_request(uint64_t id, const TokenEvent& final_event) {
  auto it = active.find(id);
  if (it == active.end()) return;
  it->second->deliver(final_event);  // a throwing callback cannot stop the end
  active.erase(it);
  try {
    const Sequence& s = sched->sequence(static_cast<SeqId>(id));
    if (s.state == SeqState::kFinished || s.state == SeqState::kCancelled)
      sched->erase(static_cast<SeqId>(id));
  } catch (const Error&) {
    // not (or no longer) in the scheduler, or still in the executing step: erased at reset
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    if (final_event.finish != FinishReason::Cancelled || !final_event.error.empty())
      stats.requests_finished++;
    stats.prompt_tokens += static_cast<uint64_t>(final_event.prompt_tokens);
    stats.cached_prompt_tokens += static_cast<uint64_t>(final_event.cached_tokens);
  }
  ++ended_unpublished;  // drain() hears of it with the stats that follow this end
}

void Engine::Impl::fail_in_flight(const BatchPlan& plan, const std::string& error) {
  for (const SeqStep& st : plan.seqs) sched->cancel(st.id);
  try {
    sched->commit(plan, {});
  } catch (const std::exception& e) {
    reset_scheduler(error + "; then: " + e.what());
    return;
  }
  for (const SeqStep& st : plan.seqs) {
    auto it = active.find(static_cast<uint64_t>(st.id));
    if (it != active.end())
      end_request(it->first, it->second->final_event(FinishReason::Length, error));
  }
  publish_stats(0);
}

// The scheduler's state cannot be trusted any more: every request fails, and the scheduler and
// page manager start afresh (the KV memory's content is then meaningless, which is fine).
void Engine::Impl::reset_scheduler(const std::string& error) {
  std::vector<uint64_t> ids;
  for (const auto& [id, r] : active) ids.push_back(id);
  preemptions_before_reset += uint64_t(sched->stats().preemptions);
  sched.reset();
  pages = std::make_unique<KvPageManager>(cfg.num_pages, cfg.page_size);
  sched =
      std::make_unique<Scheduler>(SchedulerConfig{cfg.max_step_tokens, cfg.max_batch, 0}, *pages);
  for (uint64_t id : ids) end_request(id, active.at(id)->final_event(FinishReason::Length, error));
  publish_stats(0);
}

void Engine::Impl::publish_stats(uint64_t new_tokens) {
  const KvPageStats ks = pages->stats();
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mu);
  stats.running = sched->num_running();
  sched_waiting = sched->num_waiting();
  stats.generated_tokens += new_tokens;
  stats.kv_pages_used = ks.used_pages;
  stats.kv_pages_shared = ks.shared_pages;
  stats.kv_pages_cached = ks.cached_pages;
  stats.preemptions = preemptions_before_reset + uint64_t(sched->stats().preemptions);
  if (new_tokens > 0 || rate.empty()) rate.emplace_back(now, stats.generated_tokens);
  while (rate.size() > 2 &&
         std::chrono::duration<double>(now - rate[1].first).count() > kRateWindowS)
    rate.pop_front();
  if (ended_unpublished > 0) {
    outstanding -= ended_unpublished;
    ended_unpublished = 0;
    finished.notify_all();
  }
}

Engine::Engine(const LoadedModel& model, Backend& backend, const EngineConfig& config)
    : impl_(std::make_unique<Impl>(model, backend, config)) {}

Engine::~Engine() = default;

uint64_t Engine::submit(std::vector<int> prompt_ids, const RequestOptions& options,
                        EventCallback cb) {
  Impl& m = *impl_;
  Generator::check_prompt(prompt_ids, m.max_seq, m.vocab);
  std::vector<int> end_ids = options.gen.stop_ids;
  if (!options.gen.ignore_eos)
    end_ids.insert(end_ids.end(), m.model_end_ids.begin(), m.model_end_ids.end());
  uint64_t id = 0;
  {
    // Ids are taken under the lock: concurrent submits get distinct ones (a rejected request
    // leaves a gap, which is harmless).
    std::lock_guard<std::mutex> lock(m.mu);
    id = m.next_id++;
  }
  auto r = std::make_unique<EngineRequest>(id, std::move(prompt_ids), options, std::move(cb),
                                           *m.model.tokenizer, end_ids, m.max_seq);
  // The positions it may need must fit the pool (a smaller num_pages than the default).
  const int64_t positions = static_cast<int64_t>(r->prompt().size()) + r->token_limit() - 1;
  const int64_t pages = (positions + m.cfg.page_size - 1) / m.cfg.page_size;
  GYRE_CHECK(pages <= m.cfg.num_pages, "the request needs ", pages,
             " KV pages, more than the engine's ", m.cfg.num_pages, " (lower max_tokens)");
  {
    std::lock_guard<std::mutex> lock(m.mu);
    GYRE_CHECK(m.accepting, "the engine is shutting down and accepts no new requests");
    const size_t waiting = m.incoming.size() + static_cast<size_t>(m.sched_waiting);
    if (waiting >= static_cast<size_t>(m.cfg.max_queue))
      throw QueueFullError("the request queue is full (" + std::to_string(waiting) +
                           " waiting requests)");
    m.incoming.push_back(std::move(r));
    m.outstanding++;
    m.stats.requests_total++;
  }
  m.wake.notify_one();
  return id;
}

void Engine::cancel(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->cancels.push_back(id);
  }
  impl_->wake.notify_one();
}

void Engine::drain() {
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->accepting = false;
  impl_->finished.wait(lock, [&] { return impl_->outstanding == 0; });
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  EngineStats s = impl_->stats;
  s.waiting = static_cast<int>(impl_->incoming.size()) + impl_->sched_waiting;
  const auto& rate = impl_->rate;
  if (rate.size() >= 2) {
    const double dt = std::chrono::duration<double>(Clock::now() - rate.front().first).count();
    const auto n = static_cast<double>(rate.back().second - rate.front().second);
    s.tokens_per_s = dt > 0 ? n / dt : 0;
  }
  return s;
}

const Tokenizer& Engine::tokenizer() const {
  return *impl_->model.tokenizer;
}

}  // namespace gyre
