#include "quant/gguf_source.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/half.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/loader.h"
#include "quant/block_forward.h"
#include "quant/st_writer.h"
#include "tokenizer/hf_export.h"

namespace gyre::quant {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// llama.cpp's converter stores each head's q/k rows as (pair index, half) so that RoPE rotates
// adjacent rows; Hugging Face keeps (half, pair index). Row h*hd + 2*i + j of the GGUF tensor
// is row h*hd + j*hd/2 + i of the Hugging Face one. Works on [rows, cols] and on [rows] biases.
std::vector<float> unpermute_rows(const std::vector<float>& w, int64_t rows, int64_t cols,
                                  int head_dim) {
  std::vector<float> out(w.size());
  const int64_t half = head_dim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t head = r / head_dim, k = r % head_dim;
    const int64_t hf_row = head * head_dim + (k % 2) * half + k / 2;
    std::memcpy(out.data() + hf_row * cols, w.data() + r * cols,
                static_cast<size_t>(cols) * sizeof(float));
  }
  return out;
}

std::vector<uint8_t> to_bytes(const std::vector<float>& v, bool f32) {
  std::vector<uint8_t> b;
  if (f32) {
    b.resize(v.size() * sizeof(float));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  }
  b.resize(v.size() * sizeof(uint16_t));
  for (size_t k = 0; k < v.size(); ++k) {
    const uint16_t h = f32_to_f16(v[k]);
    std::memcpy(b.data() + 2 * k, &h, sizeof h);
  }
  return b;
}
// A float as the shortest decimal that reads back as it (1e-05, not 9.999999747378752e-06).
json short_float(float f) {
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, f);
  return std::strtod(std::string(buf, res.ptr).c_str(), nullptr);
}

json rope_scaling_json(const RopeConfig& r) {
  switch (r.scaling) {
    case RopeScaling::None:
      return nullptr;
    case RopeScaling::Linear:
      return {{"rope_type", "linear"}, {"factor", short_float(r.factor)}};
    case RopeScaling::Yarn: {
      json y = {{"rope_type", "yarn"},
                {"factor", short_float(r.factor)},
                {"beta_fast", short_float(r.beta_fast)},
                {"beta_slow", short_float(r.beta_slow)}};
      if (r.attention_factor > 0) y["attention_factor"] = short_float(r.attention_factor);
      return y;
    }
    default:
      fail("GGUF RoPE scaling of this kind has no config.json equivalent Gyre writes");
  }
}

}  // namespace

bool is_gguf_file(const std::string& path) {
  return path.size() > 5 && path.ends_with(".gguf") && fs::is_regular_file(path);
}

json hf_config_from(const ModelConfig& c) {
  GYRE_CHECK(c.rope.rot_dim == c.head_dim, "GGUF model rotates ", c.rope.rot_dim, " of ",
             c.head_dim, " head dimensions (partial RoPE): config.json cannot say that");
  GYRE_CHECK(c.rope.freq_factors.empty(),
             "GGUF model carries rope_freqs.weight (Llama 3.1-style RoPE scaling as per-pair "
             "divisors): convert cannot write it as config.json");
  const ArchInfo& arch = arch_lookup_gguf(c.model_type);
  json j = {{"architectures", {arch.hf_architecture}},
            {"model_type", arch.name},
            {"vocab_size", c.vocab_size},
            {"hidden_size", c.dim},
            {"intermediate_size", c.hidden_dim},
            {"num_hidden_layers", c.n_layers},
            {"num_attention_heads", c.n_heads},
            {"num_key_value_heads", c.n_kv_heads},
            {"head_dim", c.head_dim},
            {"max_position_embeddings", c.max_seq_len},
            {"rms_norm_eps", short_float(c.norm_eps)},
            {"tie_word_embeddings", c.tie_embeddings},
            {"attention_bias", c.qkv_bias},
            {"rope_theta", short_float(c.rope.theta)},
            {"torch_dtype", "float16"}};
  const json scaling = rope_scaling_json(c.rope);
  if (!scaling.is_null()) j["rope_scaling"] = scaling;
  if (c.rope.scaling == RopeScaling::Yarn && c.rope.original_max_pos != c.max_seq_len) {
    // config_from_hf_json derives a YaRN factor of max_position / original from these two.
    const double derived = static_cast<double>(c.max_seq_len) / c.rope.original_max_pos;
    GYRE_CHECK(std::abs(derived - c.rope.factor) <= 1e-6 * derived, "GGUF YaRN factor ",
               c.rope.factor, " is not context ", c.max_seq_len, " / original context ",
               c.rope.original_max_pos, ": config.json cannot say that");
    j["rope_scaling"]["original_max_position_embeddings"] = c.rope.original_max_pos;
  }
  if (arch.uses_sliding_window) {
    j["use_sliding_window"] = c.sliding_window > 0;
    if (c.sliding_window > 0) j["sliding_window"] = c.sliding_window;
  }
  if (c.bos_id >= 0) j["bos_token_id"] = c.bos_id;
  if (!c.eos_ids.empty())
    j["eos_token_id"] = c.eos_ids.size() == 1 ? json(c.eos_ids[0]) : json(c.eos_ids);
  return j;
}

void export_gguf_as_hf(const std::string& gguf_path, const std::string& out_dir,
                       uint64_t shard_bytes) {
  GYRE_CHECK(is_gguf_file(gguf_path), "'", gguf_path, "' is not a .gguf file");
  const auto m = load_model(gguf_path);
  const ModelConfig& c = m->config;
  // Everything that can fail is derived before anything is written.
  const json config = hf_config_from(c);
  std::string tokenizer_text, tokenizer_config_text;
  {
    const auto f = GgufFile::open(gguf_path);
    const GgufVocab vocab = gguf_read_vocab(*f);
    try {
      tokenizer_text = gguf_vocab_to_tokenizer_json(vocab).dump();
      tokenizer_config_text = gguf_vocab_to_tokenizer_config(vocab, gguf_chat_template(*f)).dump(2);
    } catch (const json::exception& e) {
      fail("'", gguf_path, "': the tokenizer metadata cannot be written as JSON (", e.what(), ")");
    }
  }
  // Each tensor is dequantized when the writer reaches it: one at a time in memory.
  std::vector<StSource> tensors;
  for (const auto& [name, t] : m->weights.all()) {
    const bool is_q = name.find("self_attn.q_proj.") != std::string::npos;
    const bool is_k = name.find("self_attn.k_proj.") != std::string::npos;
    const bool unpermute = c.rope.interleaved && (is_q || is_k);
    const int64_t rows = t.shape.empty() ? 1 : t.shape[0];
    if (unpermute)
      GYRE_CHECK(
          rows == int64_t{is_q ? c.n_heads : c.n_kv_heads} * c.head_dim && c.head_dim % 2 == 0,
          "tensor ", name, " does not hold whole heads");
    const bool f32 = t.dtype == DType::F32 || t.dtype == DType::BF16;
    const TensorView* view = &t;
    const int head_dim = c.head_dim;
    tensors.push_back({name, f32 ? "F32" : "F16", t.shape, nullptr,
                       static_cast<size_t>(t.numel()) * (f32 ? 4 : 2), [=] {
                         std::vector<float> v = tensor_to_f32(*view);
                         if (unpermute)
                           v = unpermute_rows(v, rows, static_cast<int64_t>(v.size()) / rows,
                                              head_dim);
                         return to_bytes(v, f32);
                       }});
  }
  write_safetensors_shards(out_dir, tensors, shard_bytes);
  write_file_atomic(out_dir + "/tokenizer.json", tokenizer_text);
  write_file_atomic(out_dir + "/tokenizer_config.json", tokenizer_config_text);
  write_file_atomic(out_dir + "/config.json", config.dump(2));
  load_model(out_dir);  // the folder must load: throws here rather than at first use
}

}  // namespace gyre::quant
