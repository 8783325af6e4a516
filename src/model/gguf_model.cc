#include "model/gguf_model.h"

#include <array>
#include <climits>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace gyre {

namespace {

// An integer key that must fit an int; nullopt when absent.
std::optional<int> int_key(const GgufFile& f, const std::string& key) {
  const auto v = f.get_int(key);
  if (!v) return std::nullopt;
  GYRE_CHECK(*v >= 0 && *v <= INT_MAX, f.name(), ": metadata '", key, "' = ", *v,
             " is out of range");
  return static_cast<int>(*v);
}

int required_int(const GgufFile& f, const std::string& key) {
  const auto v = int_key(f, key);
  GYRE_CHECK(v.has_value(), f.name(), ": missing metadata '", key, "'");
  return *v;
}

bool has_tensor(const GgufFile& f, const std::string& name) {
  for (const auto& t : f.tensors())
    if (t.name == name) return true;
  return false;
}

const GgufTensorInfo* find_tensor(const GgufFile& f, const std::string& name) {
  for (const auto& t : f.tensors())
    if (t.name == name) return &t;
  return nullptr;
}

RopeScaling rope_scaling_from(const GgufFile& f, const std::string& type) {
  if (type.empty() || type == "none") return RopeScaling::None;
  if (type == "linear") return RopeScaling::Linear;
  if (type == "yarn") return RopeScaling::Yarn;
  fail(f.name(), ": unsupported rope.scaling.type '", type, "' (Gyre reads none, linear, yarn)");
}

// Per-layer tensor suffixes: GGUF name -> canonical name (without "model.layers.N.").
constexpr std::array<std::pair<const char*, const char*>, 12> kLayerNames = {{
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
    {"attn_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
}};

}  // namespace

std::string gguf_canonical_name(const std::string& n) {
  if (n == "token_embd.weight") return "model.embed_tokens.weight";
  if (n == "output_norm.weight") return "model.norm.weight";
  if (n == "output.weight") return "lm_head.weight";
  if (n.rfind("blk.", 0) != 0) return {};
  const size_t dot = n.find('.', 4);
  if (dot == std::string::npos || dot == 4 || dot - 4 > 6) return {};
  int layer = 0;
  for (size_t i = 4; i < dot; ++i) {
    if (n[i] < '0' || n[i] > '9') return {};
    layer = layer * 10 + (n[i] - '0');
  }
  if (n[4] == '0' && dot != 5) return {};  // no leading zeros: one spelling per layer
  const std::string suffix = n.substr(dot + 1);
  for (const auto& [gguf, canonical] : kLayerNames)
    if (suffix == gguf) return layer_tensor(layer, canonical);
  return {};
}

ModelConfig gguf_read_config(const GgufFile& f) {
  const auto gguf_arch = f.get_string("general.architecture");
  GYRE_CHECK(gguf_arch.has_value(), f.name(), ": missing metadata 'general.architecture'");
  const ArchInfo& arch = arch_lookup_gguf(*gguf_arch);
  const std::string p = *gguf_arch + ".";

  ModelConfig c;
  c.arch = arch.name;
  c.model_type = *gguf_arch;
  c.dim = required_int(f, p + "embedding_length");
  c.hidden_dim = required_int(f, p + "feed_forward_length");
  c.n_layers = required_int(f, p + "block_count");
  c.n_heads = required_int(f, p + "attention.head_count");
  GYRE_CHECK(c.n_heads > 0, f.name(), ": attention.head_count must be positive");
  c.n_kv_heads = int_key(f, p + "attention.head_count_kv").value_or(c.n_heads);
  c.head_dim = int_key(f, p + "attention.key_length").value_or(c.dim / c.n_heads);
  c.max_seq_len = int_key(f, p + "context_length").value_or(2048);
  c.norm_eps =
      static_cast<float>(f.get_float(p + "attention.layer_norm_rms_epsilon").value_or(1e-5));
  if (arch.uses_sliding_window)
    c.sliding_window = int_key(f, p + "attention.sliding_window").value_or(0);

  if (const GgufValue* tokens = f.get_array("tokenizer.ggml.tokens", GgufType::String)) {
    GYRE_CHECK(tokens->count <= INT_MAX, f.name(), ": token list too long");
    c.vocab_size = static_cast<int>(tokens->count);
  } else if (const auto v = int_key(f, p + "vocab_size")) {
    c.vocab_size = *v;
  } else if (const GgufTensorInfo* e = find_tensor(f, "token_embd.weight");
             e != nullptr && e->ne.size() == 2 && e->ne[1] <= INT_MAX) {
    c.vocab_size = static_cast<int>(e->ne[1]);
  }
  c.tie_embeddings = !has_tensor(f, "output.weight");
  c.qkv_bias = arch.qkv_bias || has_tensor(f, "blk.0.attn_q.bias");

  RopeConfig& r = c.rope;
  r.theta = static_cast<float>(f.get_float(p + "rope.freq_base").value_or(10000.0));
  r.rot_dim = int_key(f, p + "rope.dimension_count").value_or(c.head_dim);
  r.interleaved = arch.gguf_rope_interleaved;
  r.scaling = rope_scaling_from(f, f.get_string(p + "rope.scaling.type").value_or(""));
  r.factor = static_cast<float>(f.get_float(p + "rope.scaling.factor").value_or(1.0));
  if (r.scaling == RopeScaling::None) r.factor = 1.0f;
  GYRE_CHECK(r.factor > 0.0f, f.name(), ": rope.scaling.factor must be positive");
  r.original_max_pos =
      int_key(f, p + "rope.scaling.original_context_length").value_or(c.max_seq_len);
  if (r.scaling == RopeScaling::Yarn) {
    r.attention_factor =
        static_cast<float>(f.get_float(p + "rope.scaling.attn_factor").value_or(0));
    r.beta_fast = static_cast<float>(f.get_float(p + "rope.scaling.yarn_beta_fast").value_or(32));
    r.beta_slow = static_cast<float>(f.get_float(p + "rope.scaling.yarn_beta_slow").value_or(1));
  }
  // llama.cpp's converter stores Llama 3.1-style scaling as per-pair frequency divisors.
  if (const GgufTensorInfo* t = find_tensor(f, "rope_freqs.weight")) {
    GYRE_CHECK(t->dtype == DType::F32 && t->ne.size() == 1 && t->ne[0] == r.rot_dim / 2, f.name(),
               ": rope_freqs.weight must be F32 of rope dimension / 2 = ", r.rot_dim / 2,
               " elements");
    r.freq_factors.resize(static_cast<size_t>(r.rot_dim / 2));
    std::memcpy(r.freq_factors.data(), t->data, r.freq_factors.size() * sizeof(float));
    for (float v : r.freq_factors)
      GYRE_CHECK(v > 0.0f && std::isfinite(v), f.name(), ": rope_freqs.weight holds ", v);
  }

  c.bos_id = static_cast<int>(f.get_int("tokenizer.ggml.bos_token_id").value_or(-1));
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
    const auto id = int_key(f, key);
    if (id && (c.eos_ids.empty() || c.eos_ids[0] != *id)) c.eos_ids.push_back(*id);
  }
  config_validate(c);
  return c;
}

void gguf_read_weights(const GgufFile& f, WeightSet& out) {
  for (const GgufTensorInfo& t : f.tensors()) {
    std::string name = gguf_canonical_name(t.name);
    if (name.empty()) continue;  // e.g. rope_freqs.weight: not used by Gyre's forward pass
    GYRE_CHECK(t.dtype.has_value(), f.name(), ": tensor '", t.name, "' has type ",
               ggml_type_name(t.ggml_type),
               ", which Gyre cannot read (it reads F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K "
               "and Q6_K)");
    TensorView v;
    v.name = std::move(name);
    v.dtype = *t.dtype;
    v.shape.assign(t.ne.rbegin(), t.ne.rend());
    v.data = t.data;
    v.nbytes = t.nbytes;
    out.add(std::move(v));
  }
  if (f.file()) out.keep(f.file());
}

GgufVocab gguf_read_vocab(const GgufFile& f) {
  GgufVocab v;
  v.model = f.get_string("tokenizer.ggml.model").value_or("");
  GYRE_CHECK(!v.model.empty(), f.name(), ": missing metadata 'tokenizer.ggml.model'");
  v.pre = f.get_string("tokenizer.ggml.pre").value_or("");
  const GgufValue* tokens = f.get_array("tokenizer.ggml.tokens", GgufType::String);
  GYRE_CHECK(tokens != nullptr && tokens->count > 0, f.name(),
             ": missing metadata 'tokenizer.ggml.tokens'");
  v.tokens.assign(tokens->strings.begin(), tokens->strings.end());
  const uint64_t n = tokens->count;
  if (const GgufValue* s = f.get_array("tokenizer.ggml.scores", GgufType::F32)) {
    GYRE_CHECK(s->count == n, f.name(), ": ", s->count, " token scores for ", n, " tokens");
    for (uint64_t k = 0; k < n; ++k) v.scores.push_back(static_cast<float>(s->elem_float(k)));
  }
  if (const GgufValue* tt = f.get_array("tokenizer.ggml.token_type", GgufType::I32)) {
    GYRE_CHECK(tt->count == n, f.name(), ": ", tt->count, " token types for ", n, " tokens");
    for (uint64_t k = 0; k < n; ++k) {
      const int64_t type = tt->elem_int(k);
      GYRE_CHECK(type >= 0 && type <= 6, f.name(), ": token ", k, " has invalid type ", type);
      v.token_types.push_back(static_cast<int32_t>(type));
    }
  }
  if (const GgufValue* m = f.get_array("tokenizer.ggml.merges", GgufType::String))
    v.merges.assign(m->strings.begin(), m->strings.end());
  auto id = [&](const char* key) {
    const auto x = f.get_int(key);
    if (!x) return -1;
    GYRE_CHECK(*x >= 0 && static_cast<uint64_t>(*x) < n, f.name(), ": ", key, " = ", *x,
               " is not a token id (vocab of ", n, ")");
    return static_cast<int>(*x);
  };
  v.bos_id = id("tokenizer.ggml.bos_token_id");
  v.eos_id = id("tokenizer.ggml.eos_token_id");
  v.unk_id = id("tokenizer.ggml.unknown_token_id");
  v.pad_id = id("tokenizer.ggml.padding_token_id");
  v.add_bos = f.get_bool("tokenizer.ggml.add_bos_token").value_or(v.add_bos);
  v.add_eos = f.get_bool("tokenizer.ggml.add_eos_token").value_or(v.add_eos);
  // SentencePiece vocabularies prefix a space by default; byte-level BPE ones do not.
  v.add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix").value_or(v.model == "llama");
  return v;
}

std::string gguf_chat_template(const GgufFile& f) {
  return f.get_string("tokenizer.chat_template").value_or("");
}

}  // namespace gyre
