// GGUF parser and model reader against gguf-py (the Python package of llama.cpp): the fixtures
// in tests/data were written by gguf.GGUFWriter, and the .json files hold what gguf.GGUFReader
// and gguf.quants.dequantize read back (tools/make_gguf_fixtures.py).
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"
#include "core/tensor.h"
#include "model/gguf.h"
#include "model/gguf_model.h"

namespace gyre {
namespace {

using nlohmann::json;
const std::string kData = std::string(GYRE_SOURCE_DIR) + "/tests/data/";
const std::string kSmol = std::string(GYRE_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

json load_json(const std::string& path) {
  return json::parse(read_text_file(path));
}

// Compares every float of the stored slices (rows of ne[0] elements, first k values) with
// Gyre's dequantization of the same tensor, bit for bit.
void expect_slices_equal(const GgufFile& f, const json& slices) {
  int checked = 0;
  for (const auto& [name, rows] : slices.items()) {
    const GgufTensorInfo* t = nullptr;
    for (const auto& x : f.tensors())
      if (x.name == name) t = &x;
    ASSERT_NE(t, nullptr) << name;
    ASSERT_TRUE(t->dtype.has_value());
    const int64_t row_len = t->ne[0];
    const size_t row_bytes = dtype_row_bytes(*t->dtype, row_len);
    std::vector<float> row(static_cast<size_t>(row_len));
    for (const auto& [r, want] : rows.items()) {
      const size_t ri = std::stoul(r);
      dequantize_row(*t->dtype, t->data + ri * row_bytes, row.data(), row_len);
      for (size_t k = 0; k < want.size(); ++k, ++checked)
        ASSERT_EQ(row[k], want[k].get<float>()) << name << " row " << r << " col " << k;
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(Gguf, MetadataOfEveryTypeMatchesGgufPy) {
  const json want = load_json(kData + "meta_types.json");
  const auto f = GgufFile::open(kData + "meta_types.gguf");
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 64u);
  for (const auto& [key, types] : want["types"].items()) {
    if (key.rfind("GGUF.", 0) == 0) continue;
    const GgufValue* v = f->find(key);
    ASSERT_NE(v, nullptr) << key;
    EXPECT_EQ(static_cast<int>(v->type), types[0].get<int>()) << key;
    if (types.size() > 1) {
      EXPECT_EQ(static_cast<int>(v->elem_type), types[1].get<int>()) << key;
    }
  }
  const json& fields = want["fields"];
  for (const char* k : {"t.u8", "t.u16", "t.u32", "t.u64"}) EXPECT_EQ(f->find(k)->u, fields[k]);
  for (const char* k : {"t.i8", "t.i16", "t.i32", "t.i64"}) EXPECT_EQ(f->find(k)->i, fields[k]);
  EXPECT_EQ(static_cast<float>(f->find("t.f32")->f), fields["t.f32"].get<float>());
  EXPECT_EQ(f->find("t.f64")->f, fields["t.f64"].get<double>());
  EXPECT_EQ(*f->get_bool("t.bool"), fields["t.bool"].get<bool>());
  EXPECT_EQ(*f->get_string("t.str"), fields["t.str"].get<std::string>());
  const GgufValue* a = f->get_array("t.arr_i16", GgufType::I16);
  ASSERT_EQ(a->count, fields["t.arr_i16"].size());
  for (uint64_t k = 0; k < a->count; ++k) EXPECT_EQ(a->elem_int(k), fields["t.arr_i16"][k]);
  const GgufValue* d = f->get_array("t.arr_f64", GgufType::F64);
  for (uint64_t k = 0; k < d->count; ++k) EXPECT_EQ(d->elem_float(k), fields["t.arr_f64"][k]);
  const GgufValue* s = f->get_array("t.arr_str", GgufType::String);
  ASSERT_EQ(s->strings.size(), fields["t.arr_str"].size());
  for (size_t k = 0; k < s->strings.size(); ++k) EXPECT_EQ(s->strings[k], fields["t.arr_str"][k]);
  // Nested arrays: the writer's input (GGUFReader's contents() flattens them).
  const json& nested = want["nested_input"]["t.arr_nested"];
  const GgufValue* n = f->get_array("t.arr_nested", GgufType::Array);
  ASSERT_EQ(n->arrays.size(), nested.size());
  for (size_t k = 0; k < nested.size(); ++k) {
    ASSERT_EQ(n->arrays[k].count, nested[k].size());
    for (size_t j = 0; j < nested[k].size(); ++j) EXPECT_EQ(n->arrays[k].elem_int(j), nested[k][j]);
  }
  const json& nested_str = want["nested_input"]["t.arr_nested_str"];
  const GgufValue* ns = f->get_array("t.arr_nested_str", GgufType::Array);
  ASSERT_EQ(ns->arrays.size(), nested_str.size());
  for (size_t k = 0; k < nested_str.size(); ++k)
    for (size_t j = 0; j < nested_str[k].size(); ++j)
      EXPECT_EQ(ns->arrays[k].strings.at(j), nested_str[k][j]);
  // Tensor data placed at the aligned offsets GGUFReader computes.
  for (const auto& t : f->tensors())
    EXPECT_EQ(static_cast<size_t>(t.data - f->file()->data()),
              want["tensor_offsets"][t.name].get<size_t>())
        << t.name;
  EXPECT_THROW(f->get_string("t.u8"), Error);
  EXPECT_THROW(f->get_int("t.str"), Error);
  EXPECT_FALSE(f->get_int("no.such.key").has_value());
}

TEST(Gguf, TinyLlamaConfigWeightsAndVocabMatchGgufPy) {
  const json want = load_json(kData + "tiny_llama.json");
  const json& m = want["fields"];
  const auto f = GgufFile::open(kData + "tiny_llama.gguf");
  const ModelConfig c = gguf_read_config(*f);
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.dim, m["llama.embedding_length"]);
  EXPECT_EQ(c.hidden_dim, m["llama.feed_forward_length"]);
  EXPECT_EQ(c.n_layers, m["llama.block_count"]);
  EXPECT_EQ(c.n_heads, m["llama.attention.head_count"]);
  EXPECT_EQ(c.n_kv_heads, m["llama.attention.head_count_kv"]);
  EXPECT_EQ(c.head_dim, c.dim / c.n_heads);
  EXPECT_EQ(c.max_seq_len, m["llama.context_length"]);
  EXPECT_EQ(c.norm_eps, m["llama.attention.layer_norm_rms_epsilon"].get<float>());
  EXPECT_EQ(c.rope.theta, m["llama.rope.freq_base"].get<float>());
  EXPECT_EQ(c.rope.rot_dim, m["llama.rope.dimension_count"]);
  EXPECT_EQ(m["llama.rope.scaling.type"], "linear");
  EXPECT_EQ(c.rope.scaling, RopeScaling::Linear);
  EXPECT_EQ(c.rope.factor, m["llama.rope.scaling.factor"].get<float>());
  EXPECT_EQ(c.rope.original_max_pos, m["llama.rope.scaling.original_context_length"]);
  EXPECT_TRUE(c.rope.interleaved);  // llama GGUF: q/k rows permuted for pairwise RoPE
  EXPECT_EQ(c.vocab_size, static_cast<int>(m["tokenizer.ggml.tokens"].size()));
  EXPECT_FALSE(c.tie_embeddings);  // output.weight is present
  EXPECT_EQ(c.bos_id, m["tokenizer.ggml.bos_token_id"]);
  EXPECT_EQ(c.eos_ids, std::vector<int>{m["tokenizer.ggml.eos_token_id"].get<int>()});

  WeightSet w;
  gguf_read_weights(*f, w);
  weights_validate(w, c);
  for (const auto& [gname, info] : want["tensors"].items()) {
    const TensorView& t = w.get(gguf_canonical_name(gname));
    std::vector<int64_t> shape(info["ne"].rbegin(), info["ne"].rend());
    EXPECT_EQ(t.shape, shape) << gname;
    EXPECT_EQ(dtype_name(t.dtype), info["type"].get<std::string>()) << gname;
    EXPECT_EQ(t.nbytes, info["n_bytes"].get<size_t>()) << gname;
  }
  EXPECT_EQ(w.all().size(), want["tensors"].size());
  expect_slices_equal(*f, want["slices"]);

  const GgufVocab v = gguf_read_vocab(*f);
  EXPECT_EQ(v.model, m["tokenizer.ggml.model"]);
  EXPECT_EQ(v.pre, m["tokenizer.ggml.pre"]);
  EXPECT_EQ(v.tokens, m["tokenizer.ggml.tokens"].get<std::vector<std::string>>());
  EXPECT_EQ(v.scores, m["tokenizer.ggml.scores"].get<std::vector<float>>());
  EXPECT_EQ(v.token_types, m["tokenizer.ggml.token_type"].get<std::vector<int32_t>>());
  EXPECT_EQ(v.bos_id, m["tokenizer.ggml.bos_token_id"]);
  EXPECT_EQ(v.eos_id, m["tokenizer.ggml.eos_token_id"]);
  EXPECT_EQ(v.unk_id, m["tokenizer.ggml.unknown_token_id"]);
  EXPECT_EQ(v.add_bos, m["tokenizer.ggml.add_bos_token"]);
  EXPECT_EQ(v.add_eos, m["tokenizer.ggml.add_eos_token"]);
  EXPECT_EQ(v.add_space_prefix, m["tokenizer.ggml.add_space_prefix"]);
  EXPECT_EQ(gguf_chat_template(*f), m["tokenizer.chat_template"]);
}

TEST(Gguf, CanonicalNames) {
  // The mapping is the one model/weights.h documents.
  EXPECT_EQ(gguf_canonical_name("token_embd.weight"), "model.embed_tokens.weight");
  EXPECT_EQ(gguf_canonical_name("output.weight"), "lm_head.weight");
  EXPECT_EQ(gguf_canonical_name("output_norm.weight"), "model.norm.weight");
  EXPECT_EQ(gguf_canonical_name("blk.12.attn_output.weight"),
            "model.layers.12.self_attn.o_proj.weight");
  EXPECT_EQ(gguf_canonical_name("blk.0.attn_k.bias"), "model.layers.0.self_attn.k_proj.bias");
  EXPECT_EQ(gguf_canonical_name("blk.3.ffn_norm.weight"),
            "model.layers.3.post_attention_layernorm.weight");
  EXPECT_EQ(gguf_canonical_name("rope_freqs.weight"), "");
  EXPECT_EQ(gguf_canonical_name("blk.x.attn_q.weight"), "");
  EXPECT_EQ(gguf_canonical_name("blk.01.attn_q.weight"), "");
  EXPECT_EQ(gguf_canonical_name("blk..attn_q.weight"), "");
}

// The real SmolLM2-135M-Instruct Q4_1 file (scripts/fetch_models.sh); expected values were read
// by gguf.GGUFReader / gguf.quants.dequantize into smollm2_expected.json.
TEST(Gguf, SmolLM2MatchesGgufPy) {
  if (!file_exists(kSmol)) GTEST_SKIP() << kSmol << " missing: run scripts/fetch_models.sh";
  const json want = load_json(kData + "smollm2_expected.json");
  const json& m = want["fields"];
  const auto f = GgufFile::open(kSmol);
  EXPECT_EQ(f->tensors().size(), want["n_tensors"].get<size_t>());
  const ModelConfig c = gguf_read_config(*f);
  EXPECT_EQ(c.arch, m["general.architecture"]);
  EXPECT_EQ(c.dim, m["llama.embedding_length"]);
  EXPECT_EQ(c.hidden_dim, m["llama.feed_forward_length"]);
  EXPECT_EQ(c.n_layers, m["llama.block_count"]);
  EXPECT_EQ(c.n_heads, m["llama.attention.head_count"]);
  EXPECT_EQ(c.n_kv_heads, m["llama.attention.head_count_kv"]);
  EXPECT_EQ(c.max_seq_len, m["llama.context_length"]);
  EXPECT_EQ(c.norm_eps, m["llama.attention.layer_norm_rms_epsilon"].get<float>());
  EXPECT_EQ(c.rope.theta, m["llama.rope.freq_base"].get<float>());
  EXPECT_EQ(c.rope.rot_dim, m["llama.rope.dimension_count"]);
  EXPECT_EQ(c.vocab_size, m["llama.vocab_size"]);
  EXPECT_EQ(c.vocab_size, want["n_tokens"]);
  EXPECT_TRUE(c.tie_embeddings);  // the file has no output.weight
  EXPECT_TRUE(c.rope.interleaved);
  EXPECT_EQ(c.bos_id, m["tokenizer.ggml.bos_token_id"]);
  EXPECT_EQ(c.eos_ids, std::vector<int>{m["tokenizer.ggml.eos_token_id"].get<int>()});

  WeightSet w;
  gguf_read_weights(*f, w);
  weights_validate(w, c);
  for (const auto& [gname, info] : want["tensors"].items()) {
    const TensorView& t = w.get(gguf_canonical_name(gname));
    EXPECT_EQ(t.shape, std::vector<int64_t>(info["ne"].rbegin(), info["ne"].rend())) << gname;
    EXPECT_EQ(dtype_name(t.dtype), info["type"].get<std::string>()) << gname;
  }
  expect_slices_equal(*f, want["slices"]);

  const GgufVocab v = gguf_read_vocab(*f);
  EXPECT_EQ(v.model, m["tokenizer.ggml.model"]);
  EXPECT_EQ(v.pre, m["tokenizer.ggml.pre"]);
  EXPECT_EQ(v.merges.size(), want["n_merges"].get<size_t>());
  for (const auto& [i, tok] : want["tokens_sample"].items())
    EXPECT_EQ(v.tokens.at(std::stoul(i)), tok);
  for (const auto& [i, mg] : want["merges_sample"].items())
    EXPECT_EQ(v.merges.at(std::stoul(i)), mg);
  EXPECT_EQ(v.add_bos, m["tokenizer.ggml.add_bos_token"]);
  EXPECT_EQ(gguf_chat_template(*f), m["tokenizer.chat_template"]);
}

}  // namespace
}  // namespace gyre
