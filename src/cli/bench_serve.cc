// The serving benchmark: N concurrent requests through the Engine (continuous batching over
// the paged KV cache), generated tokens per second per concurrency level; time to first token of
// requests sharing a long prefix (the first alone, then the rest together: the prefix is
// prefilled once); and, to show where a step's time goes, the forward pass of a decode step of
// each batch size timed alone (Transformer::forward_batch with and without the logits copy).
#include "cli/bench_serve.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "backend/backend.h"
#include "backend/cpu/trellis.h"
#include "core/error.h"
#include "core/kv_quant.h"
#include "engine/engine.h"
#include "engine/transformer.h"
#include "model/loader.h"
#include "tokenizer/tokenizer.h"
#ifdef GYRE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace gyre {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kShortPrompt = 16;  // tokens of each throughput request's prompt
constexpr int kTail = 16;         // distinct tokens after the shared prefix
constexpr int kTtftTokens = 16;   // generated per TTFT request
constexpr int kPageSize = 16;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A synthetic model has no vocabulary: ids only (the bench never needs text).
class IdsOnlyTokenizer : public Tokenizer {
 public:
  explicit IdsOnlyTokenizer(int vocab) : vocab_(vocab) {}
  std::vector<int> encode(std::string_view, bool) const override {
    fail("the synthetic model has no tokenizer");
  }
  std::string decode(const std::vector<int>&, bool) const override { return ""; }
  int vocab_size() const override { return vocab_; }
  int bos_id() const override { return -1; }
  std::vector<int> eos_ids() const override { return {}; }
  bool is_special(int) const override { return false; }
  std::string id_to_token(int) const override { return ""; }
  int token_to_id(std::string_view) const override { return -1; }

 private:
  int vocab_;
};

std::vector<int> random_ids(int n, int vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int> d(3, vocab - 1);  // clear of the usual special ids
  std::vector<int> v(static_cast<size_t>(n));
  for (int& x : v) x = d(rng);
  return v;
}

// Requests in flight: counts finished ones and records each one's first-token time.
struct Tracker {
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  uint64_t tokens = 0;
  int64_t prefilled = 0, cached = 0;  // prompt tokens run, and taken from the prefix cache
  std::vector<double> first_token_s;  // seconds after its submission; -1 until then
  std::vector<Clock::time_point> submitted;
  std::string error;

  EventCallback callback(size_t i) {
    return [this, i](const TokenEvent& e) {
      std::lock_guard<std::mutex> lock(mu);
      if (e.token >= 0) {
        ++tokens;
        if (first_token_s[i] < 0) first_token_s[i] = seconds_since(submitted[i]);
      }
      if (!e.error.empty() && error.empty()) error = e.error;
      if (e.done) {
        ++finished;
        prefilled += e.prompt_tokens - e.cached_tokens;
        cached += e.cached_tokens;
      }
      cv.notify_all();
    };
  }
  // Submits every prompt (as close together as the engine takes them) and waits for all.
  void run(Engine& engine, const std::vector<std::vector<int>>& prompts, int max_tokens) {
    first_token_s.assign(prompts.size(), -1.0);
    submitted.assign(prompts.size(), Clock::now());
    RequestOptions o;
    o.gen.max_tokens = max_tokens;
    o.gen.ignore_eos = true;
    o.gen.sampler.temperature = 0.0f;
    for (size_t i = 0; i < prompts.size(); ++i) {
      {
        std::lock_guard<std::mutex> lock(mu);
        submitted[i] = Clock::now();
      }
      engine.submit(prompts[i], o, callback(i));
    }
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return finished == static_cast<int>(prompts.size()); });
    GYRE_CHECK(error.empty(), "serving benchmark: a request failed: ", error);
  }
};

#ifdef GYRE_HAVE_CUDA
// Weights in device memory, from the shapes (an upper bound: embedding and head at FP16).
double weight_bytes_estimate(const ModelConfig& c, int bits) {
  const double linear = static_cast<double>(c.n_layers) *
                        (static_cast<double>(c.dim) * (c.q_dim() + 2.0 * c.kv_dim()) +
                         static_cast<double>(c.q_dim()) * c.dim + 3.0 * c.dim * c.hidden_dim);
  const double per_weight = bits == 16 ? 2.0 : bits / 8.0 * 1.07;  // + group scales
  return linear * per_weight + 4.0 * static_cast<double>(c.vocab_size) * c.dim;
}
#endif

// Seconds per decode step of `batch` sequences at context `ctx` (forward pass alone), with the
// logits of every row copied to the host, and without.
std::pair<double, double> time_forward_step(Transformer& t, int batch, int ctx, std::mt19937& rng) {
  const int vocab = t.config().vocab_size;
  const int pages_per_seq = (ctx + kPageSize) / kPageSize;
  auto kv = t.new_paged_kv_cache(batch * pages_per_seq, kPageSize);
  std::vector<int32_t> tables, seq_starts{0}, ctx_lens, positions, logit_rows;
  std::vector<int64_t> slots;
  for (int s = 0; s < batch; ++s) {
    for (int i = 0; i < pages_per_seq; ++i) tables.push_back(s * pages_per_seq + i);
    logit_rows.push_back(s);
  }
  std::vector<float> logits(static_cast<size_t>(batch) * vocab);  // outside the timed steps
  auto run = [&](int rows_per_seq, int pos0, uint64_t gen, int n_logits) {
    positions.clear(), slots.clear(), ctx_lens.clear(), seq_starts.assign(1, 0);
    for (int s = 0; s < batch; ++s) {
      for (int r = 0; r < rows_per_seq; ++r) {
        const int pos = pos0 + r;
        positions.push_back(pos);
        slots.push_back(int64_t{tables[size_t(s * pages_per_seq + pos / kPageSize)]} * kPageSize +
                        pos % kPageSize);
      }
      seq_starts.push_back(static_cast<int32_t>(positions.size()));
      ctx_lens.push_back(pos0 + rows_per_seq);
    }
    const std::vector<int> tokens = random_ids(static_cast<int>(positions.size()), vocab, rng);
    PagedBatch b;
    b.rows = static_cast<int>(positions.size());
    b.seqs = batch;
    b.positions = positions.data();
    b.slots = slots.data();
    b.seq_starts = seq_starts.data();
    b.context_lens = ctx_lens.data();
    b.page_tables = tables.data();
    b.max_pages = pages_per_seq;
    b.generation = gen;
    t.forward_batch(tokens.data(), b, *kv, logit_rows.data(), n_logits, logits.data());
    t.backend().synchronize();
  };
  run(ctx, 0, 1, 0);  // fill the context
  constexpr int kSteps = 8;
  double with_logits = 0, without = 0;
  for (int i = 0; i < 2 + kSteps; ++i) {
    const auto t0 = Clock::now();
    run(1, ctx, 100 + 2 * uint64_t(i), batch);
    if (i >= 2) with_logits += seconds_since(t0);
    const auto t1 = Clock::now();
    run(1, ctx, 101 + 2 * uint64_t(i), 0);
    if (i >= 2) without += seconds_since(t1);
  }
  return {with_logits / kSteps, without / kSteps};
}

}  // namespace

std::vector<int> parse_concurrency(const std::string& list) {
  std::vector<int> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    GYRE_CHECK(used == item.size() && !item.empty() && v >= 1 && v <= 4096, "--concurrency: '",
               item, "' is not a request count (1..4096)");
    out.push_back(v);
  }
  GYRE_CHECK(!out.empty(), "--concurrency needs at least one count");
  return out;
}

void run_serve_bench(const ServeBenchOptions& o) {
  GYRE_CHECK(o.model.empty() != o.synthetic.empty(), "give either -m MODEL or --synthetic NAME");
  GYRE_CHECK(o.bits == 16 || o.bits == 8 || (o.bits >= 2 && o.bits <= 6),
             "--bits must be 16, 8, 6, 5, 4, 3 or 2");
  GYRE_CHECK(
      o.trellis == 0 || (!o.synthetic.empty() && o.bits == 16 && trellis_bits_supported(o.trellis)),
      "--trellis K (2..6 or 8) needs --synthetic, and no --bits");
  GYRE_CHECK(o.decode > 0 && o.prefix > 0 && o.ttft_requests >= 0,
             "bad -n/--prefix/--ttft-requests");
  BackendOptions bo;
  bo.n_threads = o.threads;
  bo.weight_bits = o.trellis != 0 ? o.trellis : o.bits == 16 ? 0 : o.bits;
  bo.kv_cache = o.kv_cache;
  std::unique_ptr<Backend> backend = backend_create(o.device, bo);
  const bool cuda = backend->name().rfind("cuda", 0) == 0;
  GYRE_CHECK(cuda || o.bits == 16 || o.bits == 8 || o.bits == 4,
             "--bits 2, 3, 5 and 6 need a CUDA device");

  std::unique_ptr<LoadedModel> lm;
  if (!o.synthetic.empty()) {
    GYRE_CHECK(cuda, "--synthetic needs a CUDA device (weights are generated on the GPU)");
    lm = std::make_unique<LoadedModel>();
    lm->config = synthetic_config(o.synthetic);
    synthetic_weights(lm->config, lm->weights);
    lm->tokenizer = std::make_unique<IdsOnlyTokenizer>(lm->config.vocab_size);
#ifdef GYRE_HAVE_CUDA
    cuda_set_synthetic_weights(*backend, 12345);
    if (o.trellis != 0) cuda_set_synthetic_trellis(*backend, true);
#endif
  } else {
    lm = load_model(o.model);
  }
  const ModelConfig& c = lm->config;
  const int max_conc = *std::max_element(o.concurrency.begin(), o.concurrency.end());
  const int ttft_len = o.prefix + kTail + kTtftTokens;
  EngineConfig ec;
  ec.page_size = kPageSize;
  ec.max_batch = std::max(max_conc, o.ttft_requests);
  ec.max_step_tokens = std::max(2048, ec.max_batch);
  ec.max_seq_len = std::max(kShortPrompt + o.decode, o.ttft_requests > 0 ? ttft_len : 0) + 8;
  GYRE_CHECK(c.max_seq_len <= 0 || ec.max_seq_len <= c.max_seq_len, "the model's context of ",
             c.max_seq_len, " is shorter than the ", ec.max_seq_len, " positions needed");
  const int64_t pages_thr =
      int64_t{max_conc} * ((kShortPrompt + o.decode + kPageSize - 1) / kPageSize + 1);
  const int64_t pages_ttft = (ttft_len + kPageSize - 1) / kPageSize +
                             int64_t{o.ttft_requests} * ((kTail + kTtftTokens) / kPageSize + 3);
  int64_t pages = 2 * std::max(pages_thr, pages_ttft) + 64;  // room for cached prefixes
#ifdef GYRE_HAVE_CUDA
  if (cuda) {
    const KvType kv_type = parse_kv_type(o.kv_cache);
    const double page_bytes = 2.0 * c.n_layers * c.n_kv_heads * kPageSize *  // K and V rows
                              static_cast<double>(kv_row_bytes(kv_type, c.head_dim));
    // Everything must fit next to the weights and the step's activations and logits.
    const double free_now = static_cast<double>(cuda_memory_report(*backend).free);
    const double act = static_cast<double>(ec.max_step_tokens) *
                           (6.0 * c.dim + 3.0 * c.hidden_dim + c.q_dim() + 2.0 * c.kv_dim()) * 2 +
                       static_cast<double>(ec.max_batch) * c.vocab_size * 10.0;
    const double free_bytes = free_now - weight_bytes_estimate(c, o.bits) - act - 1.5 * (1 << 30);
    const int64_t fit = free_bytes > 0 ? static_cast<int64_t>(free_bytes / page_bytes) : 0;
    GYRE_CHECK(fit >= pages / 2, "serving benchmark: the KV cache needs ", pages / 2, " pages (",
               pages / 2 * page_bytes / (1 << 20), " MiB) but only ", fit,
               " fit in the free GPU memory: lower --concurrency or --prefix");
    pages = std::min(pages, fit);
  }
#endif
  ec.num_pages = static_cast<int>(pages);
  std::mt19937 rng(7);
  nlohmann::json j;
  j["device"] = backend->name();
  j["model"] = o.synthetic.empty() ? o.model : "synthetic:" + o.synthetic;
  j["bits"] = o.bits;
  j["decode_tokens"] = o.decode;
  j["kv_pages"] = ec.num_pages;
  j["page_size"] = kPageSize;
  j["kv_cache_type"] = o.kv_cache;

  // 1. The forward pass of one decode step per batch size, alone (its own model copy).
  std::vector<std::pair<double, double>> forward_s;
  {
    Transformer t(c, lm->weights, *backend, ec.max_seq_len, false);
    for (int n : o.concurrency)
      forward_s.push_back(time_forward_step(t, n, kShortPrompt + o.decode / 2, rng));
  }

  // 2. Throughput through the Engine.
  Engine engine(*lm, *backend, ec);
  {
    Tracker warm;
    warm.run(engine, {random_ids(kShortPrompt, c.vocab_size, rng)}, 4);
  }
  nlohmann::json runs = nlohmann::json::array();
  for (size_t k = 0; k < o.concurrency.size(); ++k) {
    const int n = o.concurrency[k];
    std::vector<std::vector<int>> prompts;
    for (int i = 0; i < n; ++i) prompts.push_back(random_ids(kShortPrompt, c.vocab_size, rng));
    Tracker t;
    const auto t0 = Clock::now();
    t.run(engine, prompts, o.decode);
    const double wall = seconds_since(t0);
    double ttft_max = 0;
    for (double f : t.first_token_s) ttft_max = std::max(ttft_max, f);
    nlohmann::json r;
    r["concurrency"] = n;
    r["generated_tokens"] = t.tokens;
    r["wall_s"] = wall;
    r["tokens_per_s"] = static_cast<double>(t.tokens) / wall;
    // Decode-dominated: about one step per generated token of a request.
    r["engine_ms_per_step"] = 1e3 * wall / o.decode;
    r["forward_ms_per_step"] = 1e3 * forward_s[k].first;
    r["forward_ms_per_step_no_logits"] = 1e3 * forward_s[k].second;
    r["max_ttft_ms"] = 1e3 * ttft_max;
    runs.push_back(r);
  }
  j["throughput"] = runs;

  // 3. Time to first token with a shared prefix.
  if (o.ttft_requests > 0) {
    const std::vector<int> prefix = random_ids(o.prefix, c.vocab_size, rng);
    auto prompt = [&] {
      std::vector<int> p = prefix;
      const std::vector<int> tail = random_ids(kTail, c.vocab_size, rng);
      p.insert(p.end(), tail.begin(), tail.end());
      return p;
    };
    Tracker first;
    first.run(engine, {prompt()}, kTtftTokens);
    std::vector<std::vector<int>> rest;
    for (int i = 1; i < o.ttft_requests; ++i) rest.push_back(prompt());
    Tracker others;
    others.run(engine, rest, kTtftTokens);
    double sum = 0, mx = 0;
    for (double f : others.first_token_s) sum += f, mx = std::max(mx, f);
    nlohmann::json t;
    t["requests"] = o.ttft_requests;
    t["prefix_tokens"] = o.prefix;
    t["prompt_tokens_each"] = o.prefix + kTail;
    t["first_ttft_ms"] = 1e3 * first.first_token_s[0];
    t["others_mean_ttft_ms"] = rest.empty() ? 0.0 : 1e3 * sum / static_cast<double>(rest.size());
    t["others_max_ttft_ms"] = 1e3 * mx;
    t["first_prefilled_tokens"] = first.prefilled;
    t["others_prefilled_tokens"] = others.prefilled;
    t["others_cached_tokens"] = others.cached;
    j["ttft"] = t;
  }
  engine.drain();
#ifdef GYRE_HAVE_CUDA
  // Decode steps replayed from CUDA graphs (GYRE_CUDA_GRAPH=0: none), all phases together.
  if (cuda) j["graph_replays"] = cuda_graph_replays(*backend);
#endif

  if (o.json) {
    std::cout << j.dump(2) << "\n";
    return;
  }
  std::printf("device     %s\nmodel      %s, %d-bit weights, %d KV pages of %d (%s)\n",
              j["device"].get<std::string>().c_str(), j["model"].get<std::string>().c_str(), o.bits,
              ec.num_pages, kPageSize, o.kv_cache.c_str());
  std::printf("%-8s %12s %10s %14s %14s %16s\n", "requests", "gen tok/s", "wall s",
              "engine ms/step", "fwd ms/step", "fwd no-logits ms");
  for (const auto& r : runs)
    std::printf("%-8d %12.1f %10.2f %14.2f %14.2f %16.2f\n", r["concurrency"].get<int>(),
                r["tokens_per_s"].get<double>(), r["wall_s"].get<double>(),
                r["engine_ms_per_step"].get<double>(), r["forward_ms_per_step"].get<double>(),
                r["forward_ms_per_step_no_logits"].get<double>());
  if (j.contains("graph_replays"))
    std::printf("graphs     %llu decode steps replayed\n",
                static_cast<unsigned long long>(j["graph_replays"].get<uint64_t>()));
  if (j.contains("ttft")) {
    const auto& t = j["ttft"];
    std::printf(
        "ttft       %d requests sharing %d tokens: first %.1f ms (prefilled %d tokens); others "
        "mean %.1f ms, max %.1f ms (prefilled %d tokens, %d from the prefix cache)\n",
        t["requests"].get<int>(), t["prefix_tokens"].get<int>(), t["first_ttft_ms"].get<double>(),
        static_cast<int>(t["first_prefilled_tokens"].get<int64_t>()),
        t["others_mean_ttft_ms"].get<double>(), t["others_max_ttft_ms"].get<double>(),
        static_cast<int>(t["others_prefilled_tokens"].get<int64_t>()),
        static_cast<int>(t["others_cached_tokens"].get<int64_t>()));
  }
}

}  // namespace gyre
