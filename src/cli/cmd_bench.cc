// `gyre bench`: prefill and decode throughput of a model file or of a synthetic model with the
// real shapes of a known one (random weights made on the GPU), against the memory-bandwidth
// roofline the bench measures itself. Decode is timed at a short context and at a long one.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/trellis.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/kv_quant.h"
#include "engine/transformer.h"
#include "model/loader.h"
#ifdef GYRE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "cli/bench_serve.h"

namespace gyre {

namespace {

struct BenchOptions {
  std::string model, synthetic, device = "auto", kv_cache = "f16";
  int bits = 16, part_bits = 0, trellis = 0, prompt = 2048, decode = 128, long_ctx = 8192,
      threads = 0;
  bool json = false;
  std::string concurrency;  // non-empty: the serving benchmark (bench_serve.cc)
  int prefix = 2048, ttft_requests = 32;
};

}  // namespace

ModelConfig synthetic_config(const std::string& name) {
  ModelConfig c;
  c.arch = "llama";
  c.model_type = "synthetic-" + name;
  c.head_dim = 128;
  c.norm_eps = 1e-5f;
  if (name == "llama3-8b") {
    c.vocab_size = 128256, c.dim = 4096, c.hidden_dim = 14336, c.n_layers = 32;
    c.n_heads = 32, c.n_kv_heads = 8, c.max_seq_len = 8192, c.rope.theta = 500000.0f;
  } else if (name == "llama2-7b") {
    c.vocab_size = 32000, c.dim = 4096, c.hidden_dim = 11008, c.n_layers = 32;
    c.n_heads = 32, c.n_kv_heads = 32, c.max_seq_len = 4096, c.rope.theta = 10000.0f;
  } else if (name == "mistral-7b") {
    c.vocab_size = 32000, c.dim = 4096, c.hidden_dim = 14336, c.n_layers = 32;
    c.n_heads = 32, c.n_kv_heads = 8, c.max_seq_len = 32768, c.rope.theta = 10000.0f;
    c.sliding_window = 4096;
  } else if (name == "llama-30b") {
    c.vocab_size = 32000, c.dim = 6656, c.hidden_dim = 17920, c.n_layers = 60;
    c.n_heads = 52, c.n_kv_heads = 52, c.max_seq_len = 2048, c.rope.theta = 10000.0f;
  } else {
    fail("unknown synthetic model '", name, "' (llama3-8b, llama2-7b, mistral-7b, llama-30b)");
  }
  c.rope.rot_dim = c.head_dim;
  return c;
}

// Views of one shared read-only zero mapping (pages never touched cost no memory): the CUDA
// backend ignores their contents and fills each weight on the GPU (cuda_set_synthetic_weights).
void synthetic_weights(const ModelConfig& c, WeightSet& w) {
  const size_t largest = static_cast<size_t>(
      2 * std::max<int64_t>({int64_t{c.vocab_size} * c.dim, int64_t{c.hidden_dim} * c.dim,
                             int64_t{c.q_dim()} * c.dim}));
  void* zeros =
      mmap(nullptr, largest, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  GYRE_CHECK(zeros != MAP_FAILED, "cannot map ", largest, " bytes for synthetic weight views");
  auto keep = std::make_shared<std::vector<uint8_t>>();  // WeightSet::keep needs an owner
  w.keep(keep);
  static std::vector<std::shared_ptr<void>> mappings;  // live for the process
  mappings.emplace_back(zeros, [largest](void* p) { munmap(p, largest); });
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    TensorView t;
    t.name = name;
    t.dtype = DType::F16;
    t.shape = std::move(shape);
    t.nbytes = static_cast<size_t>(t.numel()) * 2;
    t.data = zeros;
    w.add(std::move(t));
  };
  const int64_t d = c.dim, h = c.hidden_dim, q = c.q_dim(), kv = c.kv_dim();
  add("model.embed_tokens.weight", {c.vocab_size, d});
  add("lm_head.weight", {c.vocab_size, d});
  add("model.norm.weight", {d});
  for (int i = 0; i < c.n_layers; ++i) {
    add(layer_tensor(i, "input_layernorm.weight"), {d});
    add(layer_tensor(i, "post_attention_layernorm.weight"), {d});
    add(layer_tensor(i, "self_attn.q_proj.weight"), {q, d});
    add(layer_tensor(i, "self_attn.k_proj.weight"), {kv, d});
    add(layer_tensor(i, "self_attn.v_proj.weight"), {kv, d});
    add(layer_tensor(i, "self_attn.o_proj.weight"), {d, q});
    add(layer_tensor(i, "mlp.gate_proj.weight"), {h, d});
    add(layer_tensor(i, "mlp.up_proj.weight"), {h, d});
    add(layer_tensor(i, "mlp.down_proj.weight"), {d, h});
  }
}

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Host memcpy bandwidth (read + write) for the CPU backend's roofline.
double host_bandwidth() {
  const size_t bytes = 256u << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  std::memcpy(b.data(), a.data(), bytes);
  const double t0 = now_s();
  for (int i = 0; i < 4; ++i)
    std::memcpy(i % 2 ? a.data() : b.data(), i % 2 ? b.data() : a.data(), bytes);
  return 2.0 * bytes * 4 / (now_s() - t0);
}

int argmax(const std::vector<float>& v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Decode `steps` greedy tokens after the cache holds `ctx` positions; returns seconds per token.
// Fed: Transformer::decode_greedy, as generation decodes greedily (where the backend feeds steps,
// each pick becomes the next step's input on the device; GYRE_CUDA_FED=0 turns that off).
// Stepwise: forward, then the pick through Backend::sample, as sampled generation does (on CUDA
// only the id comes back; GYRE_CUDA_SAMPLE=0 copies the logits row to the host instead).
double time_decode(Transformer& t, int ctx, int steps, std::vector<float>& logits, bool fed) {
  int pos = ctx, token = argmax(logits);
  if (fed) {
    auto run = [&](int n) {
      t.decode_greedy(token, pos, n, [&](int id) {
        token = id;
        return true;
      });
      pos += n;
    };
    run(2);  // eager step, then the recorded one
    const double t0 = now_s();
    run(steps);
    return (now_s() - t0) / steps;
  }
  const SampleRequest greedy;  // temperature 0
  SampleResult picked;
  auto step = [&] {
    t.forward(&token, 1, pos, nullptr, false);
    t.sample_logits(&greedy, 1, &picked);
    GYRE_CHECK(picked.error.empty(), picked.error);
    token = picked.id;
  };
  for (int i = 0; i < 2; ++i, ++pos) step();  // eager step, then the recorded one
  const double t0 = now_s();
  for (int i = 0; i < steps; ++i, ++pos) step();
  return (now_s() - t0) / steps;
}

// Fills the cache with positions [0, ctx) in chunks of at most `chunk` tokens.
void fill_context(Transformer& t, const std::vector<int32_t>& tokens, int ctx, int chunk,
                  std::vector<float>& logits) {
  for (int pos = 0; pos < ctx; pos += chunk) {
    const int n = std::min(chunk, ctx - pos);
    t.forward(tokens.data() + pos, n, pos, logits.data(), false);
  }
}

void run_bench(const BenchOptions& o) {
  GYRE_CHECK(o.model.empty() != o.synthetic.empty(), "give either -m MODEL or --synthetic NAME");
  GYRE_CHECK(o.bits == 16 || o.bits == 8 || (o.bits >= 2 && o.bits <= 6),
             "--bits must be 16, 8, 6, 5, 4, 3 or 2");
  GYRE_CHECK(o.part_bits == 0 || (!o.synthetic.empty() && o.bits != 16),
             "--part-bits needs --synthetic and --bits below 16");
  GYRE_CHECK(o.trellis == 0 || (!o.synthetic.empty() && o.part_bits == 0 && o.bits == 16 &&
                                trellis_bits_supported(o.trellis)),
             "--trellis K (2..6 or 8) needs --synthetic, and no --bits or --part-bits");
  GYRE_CHECK(o.prompt > 0 && o.decode > 0 && o.long_ctx >= 0, "bad -p/-n/--long");
  const int bits = o.trellis != 0 ? o.trellis : o.bits;
  BackendOptions bo;
  bo.n_threads = o.threads;
  bo.weight_bits = bits == 16 ? 0 : bits;
  bo.kv_cache = o.kv_cache;
  std::unique_ptr<Backend> backend = backend_create(o.device, bo);
  const bool cuda = backend->name().rfind("cuda", 0) == 0;

  std::unique_ptr<LoadedModel> loaded;
  ModelConfig config;
  WeightSet synth;
  if (!o.synthetic.empty()) {
    GYRE_CHECK(cuda, "--synthetic needs a CUDA device (weights are generated on the GPU)");
    config = synthetic_config(o.synthetic);
    synthetic_weights(config, synth);
#ifdef GYRE_HAVE_CUDA
    cuda_set_synthetic_weights(*backend, 12345);
    if (o.part_bits != 0) cuda_set_synthetic_part_bits(*backend, o.part_bits);
    if (o.trellis != 0) cuda_set_synthetic_trellis(*backend, true);
#endif
  } else {
    loaded = load_model(o.model);
    config = loaded->config;
  }
  const int short_ctx = 128;
  const int long_ctx = std::min(o.long_ctx, config.max_seq_len > 0 ? o.long_ctx : 0);
  const int max_seq = std::max({o.prompt, short_ctx, long_ctx}) + o.decode + 4;
  Transformer t(config, o.synthetic.empty() ? loaded->weights : synth, *backend, max_seq);

  double bandwidth = 0;
#ifdef GYRE_HAVE_CUDA
  if (cuda) bandwidth = cuda_measure_bandwidth(*backend);
#endif
  if (!cuda) bandwidth = host_bandwidth();

  std::vector<int32_t> tokens(static_cast<size_t>(max_seq));
  uint32_t state = 1;
  for (auto& tok : tokens) {  // any valid ids: the timing does not depend on them
    state = state * 1664525u + 1013904223u;
    tok = static_cast<int32_t>((state >> 8) % static_cast<uint32_t>(config.vocab_size));
  }
  std::vector<float> logits(static_cast<size_t>(config.vocab_size));

  t.forward(tokens.data(), o.prompt, 0, logits.data(), false);  // warm-up
  double prefill_s = 1e30;
  for (int r = 0; r < 2; ++r) {
    const double t0 = now_s();
    t.forward(tokens.data(), o.prompt, 0, logits.data(), false);
    prefill_s = std::min(prefill_s, now_s() - t0);
  }
  fill_context(t, tokens, short_ctx, o.prompt, logits);
  const double short_s = time_decode(t, short_ctx, o.decode, logits, true);
  const double stepwise_s = time_decode(t, short_ctx, o.decode, logits, false);
  // Device time of one recorded decode step alone (no host work between steps): shows how much
  // of a step the host side (launch, logits copy, argmax) costs.
  double graph_s = 0;
  if (backend->graph_capable() && backend->replay_step(&t, 0)) {
    const double t0 = now_s();
    for (int i = 0; i < o.decode; ++i) backend->replay_step(&t, 0);
    backend->synchronize();
    graph_s = (now_s() - t0) / o.decode;
  }
  double long_s = 0;
  if (long_ctx > short_ctx) {
    fill_context(t, tokens, long_ctx, o.prompt, logits);
    long_s = time_decode(t, long_ctx, o.decode, logits, true);
  }

  // Bytes one decode step must read: every weight the backend holds (packed sizes for quantized
  // ones) except the embedding table, of which one row is read (unless it is also the LM head),
  // plus the KV cache of the context.
  double weights_read = static_cast<double>(t.weight_bytes());
#ifdef GYRE_HAVE_CUDA
  if (cuda) weights_read = static_cast<double>(cuda_memory_report(*backend).weights);
#endif
  if (!config.tie_embeddings) {
    const double embed_elem =
        cuda || o.model.empty()
            ? 2.0
            : static_cast<double>(loaded->weights.get("model.embed_tokens.weight").nbytes) /
                  (static_cast<double>(config.vocab_size) * config.dim);
    weights_read -= embed_elem * config.vocab_size * config.dim;
  }
  auto step_bytes = [&](int ctx) {
    const int span = config.sliding_window > 0 ? std::min(ctx, config.sliding_window) : ctx;
    const double kv_row =
        static_cast<double>(kv_row_bytes(parse_kv_type(o.kv_cache), config.head_dim));
    return weights_read + 2.0 * config.n_layers * config.n_kv_heads * kv_row * span;
  };
  const double bytes_short = step_bytes(short_ctx), bytes_long = step_bytes(long_ctx);
  auto roofline = [&](double bytes, double s) { return s > 0 ? bytes / bandwidth / s : 0.0; };

  nlohmann::json j;
  j["model"] = o.synthetic.empty() ? o.model : "synthetic:" + o.synthetic;
  j["device"] = backend->name();
  j["bits"] = bits;
  if (o.trellis != 0) j["trellis"] = true;
  if (o.part_bits != 0) j["part_bits"] = o.part_bits;
  j["prefill_tokens"] = o.prompt;
  j["prefill_tok_s"] = o.prompt / prefill_s;
  j["decode_tokens"] = o.decode;
  j["decode_short_ctx"] = short_ctx;
  j["decode_short_tok_s"] = 1.0 / short_s;
  j["decode_short_roofline"] = roofline(bytes_short, short_s);
  j["bytes_per_token_short"] = bytes_short;
  j["decode_short_stepwise_tok_s"] = 1.0 / stepwise_s;
  j["decode_short_stepwise_roofline"] = roofline(bytes_short, stepwise_s);
  if (graph_s > 0) {
    j["decode_short_graph_only_tok_s"] = 1.0 / graph_s;
    j["decode_short_graph_only_roofline"] = roofline(bytes_short, graph_s);
  }
  if (long_s > 0) {
    j["decode_long_ctx"] = long_ctx;
    j["decode_long_tok_s"] = 1.0 / long_s;
    j["decode_long_roofline"] = roofline(bytes_long, long_s);
    j["bytes_per_token_long"] = bytes_long;
  }
  j["bandwidth_gb_s"] = bandwidth / 1e9;
  j["weight_bytes"] = t.weight_bytes();
  j["kv_cache_bytes"] = t.cache_bytes();
  j["kv_cache_type"] = o.kv_cache;
#ifdef GYRE_HAVE_CUDA
  if (cuda) {
    const CudaMemoryReport m = cuda_memory_report(*backend);
    j["vram_weights_bytes"] = m.weights;
    j["vram_kv_bytes"] = m.kv_cache;
    j["vram_scratch_bytes"] = m.scratch;
    j["vram_used_bytes"] = m.total - m.free;
  }
#endif
  if (o.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("model      %s on %s, %d-bit%s weights, %s KV cache (%.0f MiB)\n",
              j["model"].get<std::string>().c_str(), backend->name().c_str(), bits,
              o.trellis != 0 ? " trellis" : "", o.kv_cache.c_str(),
              static_cast<double>(t.cache_bytes()) / 1048576.0);
  std::printf("bandwidth  %.0f GB/s measured\n", bandwidth / 1e9);
  std::printf("prefill    %d tokens: %.0f tok/s\n", o.prompt, o.prompt / prefill_s);
  std::printf("decode     ctx %5d: %8.1f tok/s  %.2f GB/token  %.0f%% of roofline\n", short_ctx,
              1.0 / short_s, bytes_short / 1e9, 100 * roofline(bytes_short, short_s));
  std::printf("decode     ctx %5d: %8.1f tok/s  step by step, picked by Backend::sample (%.0f%%)\n",
              short_ctx, 1.0 / stepwise_s, 100 * roofline(bytes_short, stepwise_s));
  if (graph_s > 0)
    std::printf("decode     ctx %5d: %8.1f tok/s  replaying the step graph back to back (%.0f%%)\n",
                short_ctx, 1.0 / graph_s, 100 * roofline(bytes_short, graph_s));
  if (long_s > 0)
    std::printf("decode     ctx %5d: %8.1f tok/s  %.2f GB/token  %.0f%% of roofline\n", long_ctx,
                1.0 / long_s, bytes_long / 1e9, 100 * roofline(bytes_long, long_s));
  if (j.contains("vram_used_bytes"))
    std::printf("vram       weights %.0f MiB, KV %.0f MiB, scratch %.0f MiB, used %.0f MiB\n",
                j["vram_weights_bytes"].get<double>() / 1048576.0,
                j["vram_kv_bytes"].get<double>() / 1048576.0,
                j["vram_scratch_bytes"].get<double>() / 1048576.0,
                j["vram_used_bytes"].get<double>() / 1048576.0);
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure prefill and decode speed");
  cmd->add_option("-m,--model", o->model, "model folder or .gguf file");
  cmd->add_option("--synthetic", o->synthetic,
                  "random weights of a known shape: llama3-8b, llama2-7b, mistral-7b, llama-30b");
  cmd->add_option("--bits", o->bits, "weight bits: 16, 8, 6, 5, 4, 3 or 2 (2/3/5/6: CUDA only)")
      ->capture_default_str();
  cmd->add_option("--part-bits", o->part_bits,
                  "synthetic: k_proj, v_proj and up_proj at these bits (fused parts of two widths, "
                  "as in EXL2)");
  cmd->add_option("--trellis", o->trellis,
                  "synthetic: trellis-coded weights at K bits (2..6 or 8; CUDA), groups of the "
                  "Hadamard block (GYRE_SYNTHETIC_HADAMARD=1 also rotates)");
  cmd->add_option("-p,--prompt", o->prompt, "prefill length")->capture_default_str();
  cmd->add_option("-n,--decode", o->decode, "decode steps timed")->capture_default_str();
  cmd->add_option("--long", o->long_ctx, "long context for the second decode timing (0: skip)")
      ->capture_default_str();
  cmd->add_option("--device", o->device, "cpu, cuda, cuda:N or auto")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "CPU threads (0: all)");
  add_cache_option(*cmd, o->kv_cache);
  cmd->add_flag("--json", o->json, "print JSON");
  cmd->add_option("--concurrency", o->concurrency,
                  "serving benchmark through the Engine: concurrent request counts, e.g. "
                  "1,8,32,128 (-n tokens each)");
  cmd->add_option("--prefix", o->prefix, "serving benchmark: shared prompt prefix for TTFT")
      ->capture_default_str();
  cmd->add_option("--ttft-requests", o->ttft_requests,
                  "serving benchmark: requests sharing the prefix (0: skip)")
      ->capture_default_str();
  cmd->callback([o] {
    if (o->concurrency.empty()) return run_bench(*o);
    ServeBenchOptions s;
    s.model = o->model;
    s.synthetic = o->synthetic;
    s.device = o->device;
    s.kv_cache = o->kv_cache;
    s.bits = o->bits;
    s.trellis = o->trellis;
    s.threads = o->threads;
    s.decode = o->decode;
    s.prefix = o->prefix;
    s.ttft_requests = o->ttft_requests;
    s.json = o->json;
    s.concurrency = parse_concurrency(o->concurrency);
    run_serve_bench(s);
  });
}

}  // namespace gyre
