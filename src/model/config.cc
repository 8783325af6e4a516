#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace gyre {

namespace {

using nlohmann::json;

int get_int(const json& j, const char* key, int def, bool required) {
  if (!j.contains(key) || j[key].is_null()) {
    GYRE_CHECK(!required, "config.json: missing '", key, "'");
    return def;
  }
  GYRE_CHECK(j[key].is_number_integer(), "config.json: '", key, "' must be an integer");
  const auto v = j[key].get<int64_t>();
  GYRE_CHECK(v >= 0 && v < (1ll << 31), "config.json: '", key, "' = ", v, " is out of range");
  return static_cast<int>(v);
}

float get_float(const json& j, const char* key, float def) {
  if (!j.contains(key) || j[key].is_null()) return def;
  GYRE_CHECK(j[key].is_number(), "config.json: '", key, "' must be a number");
  return j[key].get<float>();
}

void add_eos(std::vector<int>& eos, const json& v) {
  auto push = [&](int id) {
    for (int e : eos)
      if (e == id) return;
    eos.push_back(id);
  };
  if (v.is_number_integer()) push(v.get<int>());
  if (v.is_array())
    for (const auto& e : v)
      if (e.is_number_integer()) push(e.get<int>());
}

void parse_rope_scaling(const json& rs, RopeConfig& rope) {
  if (rs.is_null()) return;
  GYRE_CHECK(rs.is_object(), "config.json: 'rope_scaling' must be an object");
  std::string type;
  if (rs.contains("rope_type") && rs["rope_type"].is_string())
    type = rs["rope_type"].get<std::string>();
  else if (rs.contains("type") && rs["type"].is_string())
    type = rs["type"].get<std::string>();
  rope.factor = get_float(rs, "factor", 1.0f);
  if (type == "default" || type.empty()) {
    rope.scaling = RopeScaling::None;
  } else if (type == "linear") {
    rope.scaling = RopeScaling::Linear;
  } else if (type == "dynamic") {
    rope.scaling = RopeScaling::DynamicNtk;
  } else if (type == "llama3") {
    rope.scaling = RopeScaling::Llama3;
    rope.low_freq_factor = get_float(rs, "low_freq_factor", 1.0f);
    rope.high_freq_factor = get_float(rs, "high_freq_factor", 4.0f);
    rope.original_max_pos = get_int(rs, "original_max_position_embeddings", 8192, false);
  } else if (type == "yarn") {
    rope.scaling = RopeScaling::Yarn;
    rope.original_max_pos = get_int(rs, "original_max_position_embeddings", 0, false);
    rope.beta_fast = get_float(rs, "beta_fast", 32.0f);
    rope.beta_slow = get_float(rs, "beta_slow", 1.0f);
    rope.attention_factor = get_float(rs, "attention_factor", 0.0f);
    rope.mscale = get_float(rs, "mscale", 0.0f);
    rope.mscale_all_dim = get_float(rs, "mscale_all_dim", 0.0f);
    if (rs.contains("truncate") && rs["truncate"].is_boolean()) rope.yarn_truncate = rs["truncate"];
  } else {
    fail("config.json: unsupported rope_scaling type '", type,
         "' (Gyre supports linear, dynamic, llama3 and yarn)");
  }
  GYRE_CHECK(rope.factor > 0.0f, "config.json: rope_scaling factor must be positive");
}

}  // namespace

ModelConfig config_from_hf_json(const json& j, const json* generation) {
  GYRE_CHECK(j.is_object(), "config.json is not a JSON object");
  std::string architecture, model_type;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    architecture = j["architectures"][0].get<std::string>();
  if (j.contains("model_type") && j["model_type"].is_string())
    model_type = j["model_type"].get<std::string>();
  const ArchInfo& arch = arch_lookup_hf(architecture, model_type);

  ModelConfig c;
  c.arch = arch.name;
  c.model_type = model_type;
  c.vocab_size = get_int(j, "vocab_size", 0, true);
  c.dim = get_int(j, "hidden_size", 0, true);
  c.hidden_dim = get_int(j, "intermediate_size", 0, true);
  c.n_layers = get_int(j, "num_hidden_layers", 0, true);
  c.n_heads = get_int(j, "num_attention_heads", 0, true);
  c.n_kv_heads = get_int(j, "num_key_value_heads", c.n_heads, false);
  GYRE_CHECK(c.n_heads > 0, "config.json: num_attention_heads must be positive");
  c.head_dim = get_int(j, "head_dim", c.dim / c.n_heads, false);
  c.max_seq_len = get_int(j, "max_position_embeddings", 2048, false);
  c.norm_eps = get_float(j, "rms_norm_eps", 1e-6f);
  c.tie_embeddings = j.value("tie_word_embeddings", false);
  c.qkv_bias = arch.qkv_bias || j.value("attention_bias", false);
  if (arch.uses_sliding_window && j.contains("sliding_window") && j["sliding_window"].is_number()) {
    const bool enabled = !j.contains("use_sliding_window") || j["use_sliding_window"].is_null() ||
                         j["use_sliding_window"].get<bool>();
    if (enabled) c.sliding_window = get_int(j, "sliding_window", 0, false);
  }
  c.rope.theta = get_float(j, "rope_theta", 10000.0f);
  c.rope.rot_dim = c.head_dim;
  c.rope.interleaved = false;
  if (j.contains("rope_scaling")) parse_rope_scaling(j["rope_scaling"], c.rope);
  // transformers >= 5 writes theta and scaling together as rope_parameters.
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    c.rope.theta = get_float(j["rope_parameters"], "rope_theta", c.rope.theta);
    parse_rope_scaling(j["rope_parameters"], c.rope);
  }
  if (c.rope.original_max_pos == 0) {
    c.rope.original_max_pos = c.max_seq_len;
  } else if (c.rope.scaling == RopeScaling::Yarn) {
    // As transformers does: a config that names the pretrained length scales by the ratio.
    c.rope.factor = static_cast<float>(c.max_seq_len) / static_cast<float>(c.rope.original_max_pos);
  }
  c.bos_id = get_int(j, "bos_token_id", -1, false);
  if (j.contains("eos_token_id")) add_eos(c.eos_ids, j["eos_token_id"]);
  if (generation != nullptr && generation->is_object()) {
    if (generation->contains("eos_token_id")) add_eos(c.eos_ids, (*generation)["eos_token_id"]);
    if (c.bos_id < 0) c.bos_id = get_int(*generation, "bos_token_id", -1, false);
  }
  config_validate(c);
  return c;
}

void config_validate(const ModelConfig& c) {
  GYRE_CHECK(c.vocab_size > 0 && c.dim > 0 && c.hidden_dim > 0 && c.n_layers > 0 && c.n_heads > 0 &&
                 c.n_kv_heads > 0 && c.head_dim > 0,
             "model config has a zero size (vocab ", c.vocab_size, ", hidden ", c.dim, ", ffn ",
             c.hidden_dim, ", layers ", c.n_layers, ", heads ", c.n_heads, "/", c.n_kv_heads,
             ", head_dim ", c.head_dim, ")");
  GYRE_CHECK(c.n_heads % c.n_kv_heads == 0, "model config: ", c.n_heads,
             " attention heads are not a multiple of ", c.n_kv_heads, " key/value heads");
  GYRE_CHECK(c.head_dim % 2 == 0 && c.rope.rot_dim % 2 == 0 && c.rope.rot_dim <= c.head_dim,
             "model config: head_dim ", c.head_dim, " / rotary dim ", c.rope.rot_dim,
             " must be even");
  GYRE_CHECK(c.dim <= (1 << 20) && c.hidden_dim <= (1 << 22) && c.n_layers <= 4096 &&
                 c.vocab_size <= (1 << 24) && c.head_dim <= 1024,
             "model config has absurd sizes");
  GYRE_CHECK(c.max_seq_len > 0, "model config: max_position_embeddings must be positive");
  GYRE_CHECK(c.norm_eps > 0.0f && c.rope.theta > 0.0f,
             "model config: eps and rope theta must be positive");
}

namespace {

double yarn_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// YaRN: interpolated frequencies for the slow-rotating pairs, the original ones for the fast,
// a linear ramp between (the correction range counted in rotations over the trained length).
double yarn_blend(const RopeConfig& rope, int i, double extrapolated) {
  const double dim = rope.rot_dim;
  const double base = rope.theta;
  const double pi = 3.14159265358979323846;
  auto correction_dim = [&](double rotations) {
    return dim * std::log(rope.original_max_pos / (rotations * 2.0 * pi)) / (2.0 * std::log(base));
  };
  double low = correction_dim(rope.beta_fast), high = correction_dim(rope.beta_slow);
  if (rope.yarn_truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;
  const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
  const double keep = 1.0 - ramp;  // share of the extrapolated (original) frequency
  return extrapolated / rope.factor * (1.0 - keep) + extrapolated * keep;
}

}  // namespace

float rope_attention_factor(const RopeConfig& rope, int /*max_seq_len*/) {
  if (rope.scaling != RopeScaling::Yarn) return 1.0f;
  if (rope.attention_factor > 0.0f) return rope.attention_factor;
  if (rope.mscale > 0.0f && rope.mscale_all_dim > 0.0f)
    return static_cast<float>(yarn_mscale(rope.factor, rope.mscale) /
                              yarn_mscale(rope.factor, rope.mscale_all_dim));
  return static_cast<float>(yarn_mscale(rope.factor, 1.0));
}

std::vector<float> rope_inv_freq(const RopeConfig& rope, int max_seq_len, int seq_len) {
  const int half = rope.rot_dim / 2;
  double base = rope.theta;
  if (rope.scaling == RopeScaling::DynamicNtk && seq_len > max_seq_len) {
    // HF's dynamic NTK: grow the base with the sequence beyond the trained length.
    const double f = rope.factor;
    const double ratio = f * seq_len / max_seq_len - (f - 1.0);
    base = rope.theta * std::pow(ratio, static_cast<double>(rope.rot_dim) / (rope.rot_dim - 2));
  }
  std::vector<float> inv(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(base, (2.0 * i) / rope.rot_dim);
    if (rope.scaling == RopeScaling::Linear) f /= rope.factor;
    if (rope.scaling == RopeScaling::Yarn) f = yarn_blend(rope, i, f);
    if (static_cast<size_t>(i) < rope.freq_factors.size())
      f /= rope.freq_factors[static_cast<size_t>(i)];
    if (rope.scaling == RopeScaling::Llama3) {
      const double pi = 3.14159265358979323846;
      const double old = rope.original_max_pos;
      const double low_wavelen = old / rope.low_freq_factor;
      const double high_wavelen = old / rope.high_freq_factor;
      const double wavelen = 2.0 * pi / f;
      if (wavelen > low_wavelen) {
        f /= rope.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth =
            (old / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
        f = (1.0 - smooth) * f / rope.factor + smooth * f;
      }
    }
    inv[static_cast<size_t>(i)] = static_cast<float>(f);
  }
  return inv;
}

}  // namespace gyre
