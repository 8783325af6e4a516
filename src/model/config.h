// ModelConfig: everything the forward pass needs to know about a Llama-family model, whatever
// file it came from. Family differences are data here (see arch_table.cc), never code paths.
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace gyre {

enum class RopeScaling : uint8_t { None, Linear, DynamicNtk, Llama3, Yarn };

struct RopeConfig {
  float theta = 10000.0f;
  int rot_dim = 0;           // dimensions rotated per head (head_dim unless partial)
  bool interleaved = false;  // true: pairs (x[2i], x[2i+1]) (GGUF llama); false: rotate_half (HF)
  RopeScaling scaling = RopeScaling::None;
  float factor = 1.0f;
  // llama3 scaling
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_pos = 0;
  // YaRN (transformers' defaults); attention_factor <= 0: derived from the factor
  float beta_fast = 32.0f, beta_slow = 1.0f, attention_factor = 0.0f;
  float mscale = 0.0f, mscale_all_dim = 0.0f;
  bool yarn_truncate = true;
  // Per-pair divisors of the frequencies (GGUF rope_freqs.weight, how llama.cpp's converter
  // stores Llama 3.1 scaling); empty when absent.
  std::vector<float> freq_factors;
};

struct ModelConfig {
  std::string arch;        // row of the architecture table: "llama", "mistral", "qwen2"
  std::string model_type;  // as the file says
  int vocab_size = 0;
  int dim = 0;         // hidden size
  int hidden_dim = 0;  // FFN intermediate size
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int max_seq_len = 0;
  float norm_eps = 1e-5f;
  bool tie_embeddings = false;
  bool qkv_bias = false;   // Qwen2
  int sliding_window = 0;  // Mistral; 0 = full attention
  RopeConfig rope;
  int bos_id = -1;
  std::vector<int> eos_ids;  // from config.json, generation_config.json or GGUF metadata

  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
};

// Per-family settings: which HF architectures/model_types map to a row and its quirks.
struct ArchInfo {
  const char* name;             // canonical row name
  const char* hf_architecture;  // e.g. "LlamaForCausalLM"
  const char* gguf_arch;        // e.g. "llama"
  bool qkv_bias;
  bool uses_sliding_window;
  bool gguf_rope_interleaved;  // GGUF files of this family store q/k for pairwise RoPE
};

// Throws gyre::Error naming the architecture when it is not in the table.
const ArchInfo& arch_lookup_hf(const std::string& architecture, const std::string& model_type);
const ArchInfo& arch_lookup_gguf(const std::string& gguf_arch);
std::string arch_supported_list();

// From an HF config.json (and optionally generation_config.json). Validates every field.
ModelConfig config_from_hf_json(const nlohmann::json& config, const nlohmann::json* generation);

// Sanity checks shared by all loaders (positive sizes, heads divide dims, ...).
void config_validate(const ModelConfig& c);

// Rotary inverse frequencies for rot_dim/2 pairs, with the scaling applied for a sequence of
// seq_len (dynamic NTK depends on it). Also returns the attention scaling ("mscale") factor.
std::vector<float> rope_inv_freq(const RopeConfig& rope, int max_seq_len, int seq_len);
// The factor cos and sin are scaled by (YaRN's "mscale"; 1 for the other scalings).
float rope_attention_factor(const RopeConfig& rope, int max_seq_len);

}  // namespace gyre
