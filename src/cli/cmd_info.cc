// gyre info: what a model file holds, without uploading the weights anywhere.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>

#include "backend/cpu/qlinear_ref.h"
#include "backend/cpu/qmixed.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/kv_quant.h"

namespace gyre {

namespace {

struct InfoOptions {
  ModelOptions model;
  bool json = false;
};

const char* rope_scaling_name(RopeScaling s) {
  switch (s) {
    case RopeScaling::None:
      return "none";
    case RopeScaling::Linear:
      return "linear";
    case RopeScaling::DynamicNtk:
      return "dynamic";
    case RopeScaling::Llama3:
      return "llama3";
    case RopeScaling::Yarn:
      return "yarn";
  }
  return "unknown";
}

// The Tokenizer interface does not name its kind; the vocabulary tells: SentencePiece-style
// models carry <0xXX> byte tokens, byte-level BPE models map the space byte to "Ġ".
std::string tokenizer_kind(const Tokenizer& t) {
  if (t.token_to_id("<0x00>") >= 0) return "sentencepiece-bpe (byte fallback)";
  if (t.token_to_id("\xC4\xA0") >= 0) return "byte-level-bpe";
  return "bpe";
}

// Floats as they were written (1e-05, not 9.999999747378752e-06).
double shortest(float f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.7g", static_cast<double>(f));
  return std::strtod(buf, nullptr);
}

// How one packed weight is stored, e.g. "4b g128 sym", "3b g64 asym rotated", "4b trellis g128
// rotated" (trellis codes are always symmetric), so `gyre info` tells the schemes of a file apart.
std::string packed_scheme(const QWeightHost& q) {
  const QWeightDesc& d = q.desc;
  std::string s = std::to_string(d.bits) + "b" + (d.trellis ? " trellis" : "") + " g" +
                  std::to_string(d.group_size);
  if (!d.trellis) s += d.asymmetric ? " asym" : " sym";
  if (d.has_perm) s += " act-order";
  if (q.had.active()) s += " rotated";
  return s;
}

nlohmann::json describe(const LoadedModel& m) {
  const ModelConfig& c = m.config;
  std::map<std::string, nlohmann::json> dtypes, schemes;
  size_t weight_bytes = 0;
  for (const auto& [name, t] : m.weights.all()) {
    if (name == "lm_head.weight" && c.tie_embeddings) continue;  // a copy of the embedding
    nlohmann::json& d = dtypes[dtype_name(t.dtype)];
    if (d.is_null()) d = {{"tensors", 0}, {"params", 0}, {"bytes", 0}};
    d["tensors"] = d["tensors"].get<int64_t>() + 1;
    d["params"] = d["params"].get<int64_t>() + t.numel();
    // A packed weight's view holds an object: count the bytes it packs (data, scales, mins).
    size_t bytes = t.nbytes;
    const auto packed = [](const QWeightHost& q) {
      return q.qweight.size() + q.scales.size() + q.mins.size() + q.perm.size() * 4;
    };
    std::string scheme;
    if (is_qmixed_view(t)) {  // packed parts and their column lists, the lowest width first
      const QMixedHost& m = qmixed_of_view(t);
      bytes = 0;
      for (auto p = m.parts.rbegin(); p != m.parts.rend(); ++p) {
        bytes += packed(p->w) + p->cols.size() * 4;
        scheme += (scheme.empty() ? "" : " + ") + packed_scheme(p->w);
      }
    } else if (t.dtype == DType::QPACKED) {
      bytes = packed(qweight_of_view(t));
      scheme = packed_scheme(qweight_of_view(t));
    }
    d["bytes"] = d["bytes"].get<uint64_t>() + bytes;
    if (!scheme.empty()) {
      nlohmann::json& q = schemes[scheme];
      if (q.is_null()) q = {{"tensors", 0}, {"params", 0}, {"bytes", 0}};
      q["tensors"] = q["tensors"].get<int64_t>() + 1;
      q["params"] = q["params"].get<int64_t>() + t.numel();
      q["bytes"] = q["bytes"].get<uint64_t>() + bytes;
    }
    weight_bytes += bytes;
  }
  const int64_t kv_elems_per_token = 2LL * c.n_layers * c.kv_dim();
  auto kv_bytes_per_token = [&](KvType t) {
    return 2LL * c.n_layers * c.n_kv_heads * static_cast<int64_t>(kv_row_bytes(t, c.head_dim));
  };
  const nlohmann::json rope = {{"theta", shortest(c.rope.theta)},
                               {"rot_dim", c.rope.rot_dim > 0 ? c.rope.rot_dim : c.head_dim},
                               {"interleaved", c.rope.interleaved},
                               {"scaling", rope_scaling_name(c.rope.scaling)},
                               {"factor", shortest(c.rope.factor)}};
  const Tokenizer& tok = *m.tokenizer;
  return {{"path", m.path},
          {"format", m.format},
          {"architecture", c.arch},
          {"model_type", c.model_type},
          {"family",
           {{"qkv_bias", c.qkv_bias},
            {"sliding_window", c.sliding_window},
            {"tie_embeddings", c.tie_embeddings},
            {"norm_eps", shortest(c.norm_eps)},
            {"rope", rope}}},
          {"layers", c.n_layers},
          {"heads", c.n_heads},
          {"kv_heads", c.n_kv_heads},
          {"head_dim", c.head_dim},
          {"dim", c.dim},
          {"hidden_dim", c.hidden_dim},
          {"vocab_size", c.vocab_size},
          {"max_seq_len", c.max_seq_len},
          {"parameters", parameter_count(m)},
          {"weight_bytes", weight_bytes},
          {"dtypes", dtypes},
          {"quantization", schemes},
          {"kv_cache",
           {{"bytes_per_token_f16", kv_elems_per_token * 2},
            {"bytes_per_token_f32", kv_elems_per_token * 4},
            {"bytes_per_token_q8", kv_bytes_per_token(KvType::Q8)},
            {"bytes_per_token_q4", kv_bytes_per_token(KvType::Q4)},
            {"bytes_at_max_context_f16", kv_elems_per_token * 2 * c.max_seq_len},
            {"bytes_at_max_context_f32", kv_elems_per_token * 4 * c.max_seq_len}}},
          {"bos_id", c.bos_id},
          {"eos_ids", c.eos_ids},
          {"tokenizer",
           {{"kind", tokenizer_kind(tok)},
            {"vocab_size", tok.vocab_size()},
            {"bos_id", tok.bos_id()},
            {"eos_ids", tok.eos_ids()}}},
          {"chat_template", !m.chat_template.empty()}};
}

std::string format_bits(double bits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", bits);
  return buf;
}

void print_text(const nlohmann::json& j) {
  auto line = [](const std::string& key, const std::string& value) {
    std::printf("%-18s %s\n", (key + ":").c_str(), value.c_str());
  };
  auto str = [](const nlohmann::json& v) {
    return v.is_string() ? v.get<std::string>() : v.dump();
  };
  line("path", str(j["path"]));
  line("format", str(j["format"]));
  line("architecture", str(j["architecture"]) + " (model_type " + str(j["model_type"]) + ")");
  line("family", j["family"].dump());
  line("shape", "layers " + str(j["layers"]) + ", heads " + str(j["heads"]) + ", kv heads " +
                    str(j["kv_heads"]) + ", head dim " + str(j["head_dim"]) + ", dim " +
                    str(j["dim"]) + ", ffn " + str(j["hidden_dim"]) + ", vocab " +
                    str(j["vocab_size"]) + ", context " + str(j["max_seq_len"]));
  line("parameters",
       human_count(j["parameters"].get<int64_t>()) + " (" + str(j["parameters"]) + ")");
  line("weights", megabytes(j["weight_bytes"].get<size_t>()));
  for (const auto& [name, d] : j["dtypes"].items())
    line("  " + name, str(d["tensors"]) + " tensors, " + str(d["params"]) + " params, " +
                          megabytes(d["bytes"].get<size_t>()));
  // Packed weights by scheme, with their stored bits per weight (scales included).
  for (const auto& [name, q] : j["quantization"].items())
    line("    " + name,
         str(q["tensors"]) + " tensors, " +
             format_bits(8.0 * q["bytes"].get<double>() / q["params"].get<double>()) +
             " bits/weight");
  const auto& kv = j["kv_cache"];
  line("kv cache", str(kv["bytes_per_token_f16"]) + " bytes/token at f16 (" +
                       str(kv["bytes_per_token_f32"]) + " at f32); at " + str(j["max_seq_len"]) +
                       " tokens " + megabytes(kv["bytes_at_max_context_f16"].get<size_t>()) +
                       " at f16");
  line("kv cache q8/q4", str(kv["bytes_per_token_q8"]) + " / " + str(kv["bytes_per_token_q4"]) +
                             " bytes/token (--cache q8 / q4)");
  line("special ids", "bos " + str(j["bos_id"]) + ", eos " + str(j["eos_ids"]));
  const auto& t = j["tokenizer"];
  line("tokenizer", str(t["kind"]) + ", vocab " + str(t["vocab_size"]));
  line("chat template", j["chat_template"].get<bool>() ? "yes" : "no");
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto o = std::make_shared<InfoOptions>();
  CLI::App* cmd = app.add_subcommand(
      "info", "Describe a model: architecture, shapes, parameters, dtypes, memory, tokenizer");
  add_model_option(*cmd, o->model);
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->callback([o] {
    const nlohmann::json j = describe(*load_model(o->model.model));
    if (o->json)
      std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    else
      print_text(j);
  });
}

}  // namespace gyre
