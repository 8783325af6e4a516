// Pieces the gyre subcommands share: model/device options, sampling options, opening a model on
// a backend (with the one-line load report on stderr), and number formatting.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/generator.h"
#include "engine/transformer.h"
#include "model/loader.h"

namespace gyre {

struct ModelOptions {
  std::string model;
  std::string device = "auto";
  int threads = 0;               // 0: all cores
  int max_seq_len = 0;           // 0: the model's context, capped at kDefaultMaxSeq
  std::string kv_cache = "f16";  // --cache: f16, q8 or q4
};

// The KV cache is sized for this many tokens unless --max-seq-len asks for more.
constexpr int kDefaultMaxSeq = 4096;

void add_model_option(CLI::App& cmd, ModelOptions& o);  // -m/--model only
// --device, --threads, --max-seq-len, --cache
void add_runtime_options(CLI::App& cmd, ModelOptions& o);
// --cache f16|q8|q4 (also used by gyre bench).
void add_cache_option(CLI::App& cmd, std::string& kv_cache);
// --temp, --top-k, --top-p, --min-p, --typical-p, --repeat-penalty, --repeat-last-n,
// --frequency-penalty, --presence-penalty, --seed (seed_given tells whether --seed was passed).
void add_sampling_options(CLI::App& cmd, SamplerSettings& s, bool& seed_given);
// --stop, --stop-id, --ignore-eos, --prefill-chunk.
void add_generation_options(CLI::App& cmd, GenerationSettings& g);

// The sequence length the KV cache is built for: --max-seq-len, else the model's (capped).
int context_length(const ModelConfig& c, int requested);

// Picks a random seed unless one was given.
void finish_sampler_settings(SamplerSettings& s, bool seed_given);

struct OpenedModel {
  std::unique_ptr<LoadedModel> model;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Transformer> transformer;
};

// Creates the backend and uploads the weights, then prints one line on stderr: model path,
// format, parameters, device, weight and KV cache megabytes.
OpenedModel open_model(std::unique_ptr<LoadedModel> model, const ModelOptions& o, int max_seq);

// Chat templates: the model's template with its BOS/EOS strings, and the ids that end an
// assistant turn (added to stop_ids so a reply ends there even when the config omits them).
struct ChatFormat {
  std::string tmpl, bos, eos;
  std::vector<int> end_of_turn;
};
// Throws gyre::Error naming the model when it has no chat template.
ChatFormat chat_format(const LoadedModel& m, const std::string& model_path);
// Renders messages (+ the generation prompt) and encodes them without adding BOS: the template
// writes the special tokens itself.
std::vector<int> chat_prompt_ids(const LoadedModel& m, const ChatFormat& f,
                                 const nlohmann::json& messages);

// Parameters of the model (a tied lm_head copy counted once).
int64_t parameter_count(const LoadedModel& m);
std::string human_count(int64_t n);   // 260.1K, 24.9M, 8.03B
std::string megabytes(size_t bytes);  // "1.2 MB"

// The engine's stats as one line for stderr.
std::string stats_line(const GenerationResult& r);

}  // namespace gyre
