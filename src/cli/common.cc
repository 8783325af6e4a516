#include "cli/common.h"

#include <cstdio>
#include <random>
#include <sstream>

#include "core/error.h"
#include "tokenizer/chat_template.h"

namespace gyre {

namespace {

std::string token_text(const Tokenizer& tok, int id) {
  return id >= 0 && id < tok.vocab_size() ? tok.id_to_token(id) : std::string();
}

}  // namespace

ChatFormat chat_format(const LoadedModel& m, const std::string& model_path) {
  GYRE_CHECK(!m.chat_template.empty(), "'", model_path,
             "' has no chat template (chat_template in tokenizer_config.json, or "
             "tokenizer.chat_template in a GGUF file); chat mode renders the model's own Jinja "
             "template (e.g. Llama 2/3, Mistral, Qwen2 or SmolLM2 chat models), so use an "
             "instruct/chat model, or plain completion");
  const Tokenizer& tok = *m.tokenizer;
  ChatFormat f;
  f.tmpl = m.chat_template;
  f.bos = token_text(tok, tok.bos_id());
  std::vector<int> eos_ids = tok.eos_ids();
  if (eos_ids.empty()) eos_ids = m.config.eos_ids;
  f.eos = eos_ids.empty() ? std::string() : token_text(tok, eos_ids[0]);
  f.end_of_turn = end_of_turn_ids(tok);
  return f;
}

std::vector<int> chat_prompt_ids(const LoadedModel& m, const ChatFormat& f,
                                 const nlohmann::json& messages) {
  return m.tokenizer->encode(render_chat_template(f.tmpl, messages, true, f.bos, f.eos), false);
}

void add_model_option(CLI::App& cmd, ModelOptions& o) {
  cmd.add_option("-m,--model", o.model,
                 "Model: a Hugging Face folder (config.json + safetensors + tokenizer) or a "
                 ".gguf file")
      ->required();
}

void add_runtime_options(CLI::App& cmd, ModelOptions& o) {
  cmd.add_option("--device", o.device, "auto, cpu, cuda or cuda:N (auto: CUDA when present)")
      ->capture_default_str();
  cmd.add_option("--threads", o.threads, "CPU threads (0: all cores)")->capture_default_str();
  cmd.add_option("--max-seq-len", o.max_seq_len,
                 "Context length to allocate the KV cache for (default: the model's, at most " +
                     std::to_string(kDefaultMaxSeq) + ")");
  add_cache_option(cmd, o.kv_cache);
}

void add_cache_option(CLI::App& cmd, std::string& kv_cache) {
  cmd.add_option("--cache", kv_cache,
                 "KV cache type: f16, q8 (8-bit) or q4 (4-bit), see docs/kv_cache.md")
      ->check(CLI::IsMember({"f16", "q8", "q4"}))
      ->capture_default_str();
}

void add_sampling_options(CLI::App& cmd, SamplerSettings& s, bool& seed_given) {
  cmd.add_option("--temp,--temperature", s.temperature, "Sampling temperature; 0 = greedy")
      ->capture_default_str();
  cmd.add_option("--top-k", s.top_k, "Keep the K most likely tokens (0 = off)")
      ->capture_default_str();
  cmd.add_option("--top-p", s.top_p, "Nucleus sampling mass (1 = off)")->capture_default_str();
  cmd.add_option("--min-p", s.min_p, "Drop tokens below MIN_P times the top probability (0 = off)")
      ->capture_default_str();
  cmd.add_option("--typical-p", s.typical_p, "Locally typical sampling mass (1 = off)")
      ->capture_default_str();
  cmd.add_option("--repeat-penalty", s.repetition_penalty,
                 "Repetition penalty on recent tokens (1 = off)")
      ->capture_default_str();
  cmd.add_option("--repeat-last-n", s.penalty_window,
                 "Tokens the penalties look back over (0 = none, -1 = all)")
      ->capture_default_str();
  cmd.add_option("--frequency-penalty", s.frequency_penalty, "Subtract COUNT * this from logits")
      ->capture_default_str();
  cmd.add_option("--presence-penalty", s.presence_penalty, "Subtract this from seen tokens' logits")
      ->capture_default_str();
  cmd.add_option_function<uint64_t>(
      "--seed",
      [&s, &seed_given](const uint64_t& v) {
        s.seed = v;
        seed_given = true;
      },
      "Random seed (default: random)");
}

void add_generation_options(CLI::App& cmd, GenerationSettings& g) {
  cmd.add_option("--stop", g.stop_strings, "Stop before this text (repeatable)")
      ->allow_extra_args(false);
  cmd.add_option("--stop-id", g.stop_ids, "Stop when this token id is sampled (repeatable)")
      ->allow_extra_args(false);
  cmd.add_flag("--ignore-eos", g.ignore_eos, "Do not stop at the model's end-of-sequence ids");
  cmd.add_option("--prefill-chunk", g.prefill_chunk, "Prompt tokens per forward pass")
      ->capture_default_str();
}

void finish_sampler_settings(SamplerSettings& s, bool seed_given) {
  if (!seed_given)
    s.seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  s.validate();
}

int context_length(const ModelConfig& c, int requested) {
  GYRE_CHECK(requested >= 0, "--max-seq-len must be positive, got ", requested);
  if (requested == 0) return std::min(c.max_seq_len, kDefaultMaxSeq);
  GYRE_CHECK(requested <= c.max_seq_len, "--max-seq-len ", requested,
             " is longer than the model's context of ", c.max_seq_len, " tokens");
  return requested;
}

int64_t parameter_count(const LoadedModel& m) {
  int64_t n = 0;
  for (const auto& [name, t] : m.weights.all()) {
    if (name == "lm_head.weight" && m.config.tie_embeddings) continue;
    n += t.numel();
  }
  return n;
}

std::string human_count(int64_t n) {
  char buf[32];
  const double v = static_cast<double>(n);
  if (v >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2fB", v / 1e9);
  else if (v >= 1e6)
    std::snprintf(buf, sizeof buf, "%.1fM", v / 1e6);
  else if (v >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fK", v / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(n));
  return buf;
}

std::string megabytes(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

OpenedModel open_model(std::unique_ptr<LoadedModel> model, const ModelOptions& o, int max_seq) {
  GYRE_CHECK(o.threads >= 0, "--threads must be >= 0, got ", o.threads);
  OpenedModel e;
  e.model = std::move(model);
  BackendOptions bo;
  bo.n_threads = o.threads;
  bo.kv_cache = o.kv_cache;
  e.backend = backend_create(o.device, bo);
  e.transformer =
      std::make_unique<Transformer>(e.model->config, e.model->weights, *e.backend, max_seq);
  std::fprintf(stderr,
               "gyre: loaded %s (%s, %s), %s params, device %s, weights %s, KV cache %s (%s) for "
               "%d tokens\n",
               e.model->path.c_str(), e.model->format.c_str(), e.model->config.arch.c_str(),
               human_count(parameter_count(*e.model)).c_str(), e.backend->name().c_str(),
               megabytes(e.transformer->weight_bytes()).c_str(),
               megabytes(e.transformer->cache_bytes()).c_str(), o.kv_cache.c_str(), max_seq);
  return e;
}

std::string stats_line(const GenerationResult& r) {
  const GenerationStats& s = r.stats;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "gyre: prompt %d tokens (%d cached), generated %d tokens (%s); prefill %.3f s "
                "%.1f tok/s, decode %.3f s %.1f tok/s",
                s.prompt_tokens, s.cached_tokens, s.generated_tokens, finish_reason_name(r.finish),
                s.prefill_s, s.prefill_tok_s, s.decode_s, s.decode_tok_s);
  return buf;
}

}  // namespace gyre
