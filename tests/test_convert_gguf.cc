// `gyre convert -m MODEL.gguf`: the GGUF tokenizer written as tokenizer.json, the model
// dequantized into a Hugging Face folder, and a conversion from a GGUF file. Oracles: the
// Hugging Face goldens of the fixture tokenizers (and the GGUF tokenizer built from the same
// vocabulary), Gyre's own GGUF path (interleaved RoPE on the permuted q/k rows, the GGUF
// dequantizers checked against gguf-py in test_gguf.cc) for the logits of the exported folder,
// and transformers' recorded ids and logits of SmolLM2 (tests/data/smollm2_hf_reference.json).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "engine/transformer.h"
#include "error_test_util.h"
#include "gguf_vocab_util.h"
#include "model/loader.h"
#include "quant/block_forward.h"
#include "quant/convert.h"
#include "quant/gguf_source.h"
#include "quant/gptq.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/hf_export.h"

namespace gyre::quant {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::ids_of;
using test::load_json;
using test::tokenizer_dir;

const std::string kTiny = std::string(GYRE_SOURCE_DIR) + "/tests/data/tiny_llama.gguf";
const std::string kSmol = std::string(GYRE_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

std::string fresh_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/gyre_convert_gguf_" + name;
  fs::remove_all(d);
  return d;
}

std::unique_ptr<Tokenizer> exported(const GgufVocab& v) {
  const json config = gguf_vocab_to_tokenizer_config(v, "");
  return Tokenizer::from_hf(gguf_vocab_to_tokenizer_json(v).dump(), &config);
}

GgufVocab fixture_vocab(const std::string& name) {
  return name == "llama3" ? test::llama3_vocab() : test::llama_vocab(name);
}

class ConvertGgufTokenizer : public ::testing::TestWithParam<std::string> {};

// The written tokenizer.json encodes and decodes the goldens as Hugging Face does, and every
// vocabulary property equals the GGUF tokenizer's.
TEST_P(ConvertGgufTokenizer, TokenizerJsonEncodesLikeTheGgufTokenizer) {
  GgufVocab v = fixture_vocab(GetParam());
  v.add_bos = true;
  const auto gguf = Tokenizer::from_gguf(v);
  const auto hf = exported(v);
  ASSERT_EQ(hf->vocab_size(), gguf->vocab_size());
  EXPECT_EQ(hf->bos_id(), gguf->bos_id());
  EXPECT_EQ(hf->eos_ids(), gguf->eos_ids());
  for (int id = 0; id < gguf->vocab_size(); ++id) {
    ASSERT_EQ(hf->is_special(id), gguf->is_special(id)) << id;
    ASSERT_EQ(hf->id_to_token(id), gguf->id_to_token(id)) << id;
  }
  const auto golden = load_json(tokenizer_dir(GetParam()) + "/golden.json");
  for (const auto& c : golden.at("cases")) {
    if (c.contains("prompt")) {  // stories260K: run.c's encoding of prompts, BOS first
      EXPECT_EQ(hf->encode(c.at("prompt").get<std::string>(), true), ids_of(c.at("prompt_ids")));
      continue;
    }
    const std::string text = c.at("text");
    EXPECT_EQ(hf->encode(text, false), ids_of(c.at("ids"))) << "text: " << text;
    EXPECT_EQ(hf->encode(text, true), gguf->encode(text, true)) << "text: " << text;
    EXPECT_EQ(hf->decode(ids_of(c.at("ids")), false), c.at("decoded").get<std::string>());
    EXPECT_EQ(hf->decode(ids_of(c.at("ids")), true), gguf->decode(ids_of(c.at("ids")), true));
  }
  // Longer running text: any merge-order difference shows up here.
  const std::string story =
      read_text_file(std::string(GYRE_FIXTURES) + "/text/tinystories-sample.txt").substr(0, 20000);
  EXPECT_EQ(hf->encode(story, true), gguf->encode(story, true));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ConvertGgufTokenizer,
                         ::testing::Values("llama2", "llama3", "mistral", "stories260K"));

TEST(ConvertGguf, UnwritableInputsGiveOneLineErrors) {
  const auto one_line = testutil::expect_one_line_error;

  GgufVocab v = test::llama_vocab("stories260K");
  v.model = "bert";
  one_line([&] { gguf_vocab_to_tokenizer_json(v); }, "'bert'");
  v = test::llama_vocab("stories260K");
  v.tokens[20] = v.tokens[21];
  one_line([&] { gguf_vocab_to_tokenizer_json(v); }, "appears twice");
  auto m = load_model(kTiny);
  ModelConfig c = m->config;
  c.rope.freq_factors = {1.0f, 2.0f, 3.0f, 4.0f};
  one_line([&] { hf_config_from(c); }, "rope_freqs");
  c = m->config;
  c.rope.rot_dim = c.head_dim / 2;
  one_line([&] { hf_config_from(c); }, "partial RoPE");
  ConvertOptions o;
  o.model = kTiny + ".missing.gguf";
  o.out = fresh_dir("missing");
  one_line([&] { convert_model(o); }, "or a .gguf file");
}

// The GGUF model as Gyre reads it (its config: q/k rows permuted, pairwise RoPE), every weight
// dequantized to F32 by the GGUF dequantizers (checked against gguf-py in test_gguf.cc): the
// tiny fixture mixes types within q/k/v, which the CPU backend cannot fuse as they are.
std::unique_ptr<LoadedModel> gguf_in_f32(const std::string& path) {
  auto m = load_model(path);
  WeightSet w;
  for (const auto& [name, t] : m->weights.all()) {
    auto v = std::make_shared<std::vector<float>>(tensor_to_f32(t));
    w.add(f32_view(name, *v, t.shape));
    w.keep_owner(v);
  }
  m->weights = std::move(w);
  return m;
}

// Logits of every position of `ids` through Gyre's CPU forward pass.
std::vector<float> logits_of(const LoadedModel& m, const std::vector<int32_t>& ids) {
  auto backend = backend_create("cpu", 2);
  Transformer t(m.config, m.weights, *backend, 64);
  std::vector<float> out(ids.size() * static_cast<size_t>(m.config.vocab_size));
  t.forward(ids.data(), static_cast<int>(ids.size()), 0, out.data(), true);
  return out;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t k = 0; k < a.size(); ++k) m = std::max(m, std::abs(static_cast<double>(a[k]) - b[k]));
  return m;
}

const std::vector<int32_t> kTinyIds = {1, 11, 25, 14, 30, 12, 39, 3, 17, 22, 2, 28, 13, 19, 35, 36};

// The exported folder (q/k rows back in Hugging Face order, rotate-half RoPE, F16 weights) gives
// the GGUF model's logits up to the F16 rounding of its dequantized weights.
TEST(ConvertGguf, TinyDequantizedTwinMatchesTheGgufModel) {
  const std::string out = fresh_dir("tiny_twin");
  export_gguf_as_hf(kTiny, out);
  const auto g = gguf_in_f32(kTiny);
  const auto h = load_model(out);
  EXPECT_EQ(h->format, "hf");
  EXPECT_FALSE(h->config.rope.interleaved);
  EXPECT_EQ(h->config.dim, g->config.dim);
  EXPECT_EQ(h->config.n_kv_heads, g->config.n_kv_heads);
  EXPECT_EQ(h->config.tie_embeddings, g->config.tie_embeddings);
  EXPECT_EQ(h->config.rope.scaling, g->config.rope.scaling);
  EXPECT_EQ(h->config.rope.factor, g->config.rope.factor);
  EXPECT_EQ(h->config.rope.theta, g->config.rope.theta);
  EXPECT_EQ(h->config.norm_eps, g->config.norm_eps);
  EXPECT_EQ(h->config.bos_id, g->config.bos_id);
  EXPECT_EQ(h->config.eos_ids, g->config.eos_ids);
  EXPECT_EQ(h->chat_template, g->chat_template);
  // (The tiny vocabulary lacks the single characters its pieces are made of, which only the
  // GGUF score merge can start from; the fixture vocabularies test the tokenizer.)
  for (int id = 0; id < g->tokenizer->vocab_size(); ++id)
    EXPECT_EQ(h->tokenizer->id_to_token(id), g->tokenizer->id_to_token(id));
  const auto lg = logits_of(*g, kTinyIds), lh = logits_of(*h, kTinyIds);
  EXPECT_LT(max_diff(lg, lh), 2e-3 * max_abs(lg)) << "max |logit| " << max_abs(lg);
  // Written in shards of 4 KiB (each tensor made when the writer reaches it): the same model.
  const std::string sharded = fresh_dir("tiny_twin_shards");
  export_gguf_as_hf(kTiny, sharded, 4096);
  EXPECT_TRUE(std::filesystem::exists(sharded + "/model.safetensors.index.json"));
  EXPECT_FALSE(std::filesystem::exists(sharded + "/model.safetensors"));
  EXPECT_EQ(logits_of(*load_model(sharded), kTinyIds), lh);
}

// tiny_llama.gguf converted on the CPU into out, every layer at `uniform`, from a short
// calibration text of the tiny vocabulary's words.
void convert_tiny(const std::string& out, const std::string& uniform, int head_bits) {
  ConvertOptions o;
  o.model = kTiny;
  o.out = out;
  o.uniform = uniform;
  o.head_bits = head_bits;
  o.rows = 4;
  o.length = 32;
  o.threads = 2;
  o.device = "cpu";
  o.progress = false;
  o.calibration = ::testing::TempDir() + "/gyre_convert_gguf_calib.txt";
  {
    std::string t;
    for (int k = 0; k < 200; ++k) t += "a cab bad fig hide jig ace bead dice ";
    std::ofstream(o.calibration, std::ios::binary) << t;
  }
  convert_model(o);
}

// A whole conversion from the GGUF file: 8-bit uniform GPTQ stays within 8-bit error of the
// GGUF model, and the output folder carries the tokenizer and loads.
TEST(ConvertGguf, TinyGgufConvertsAtEightBits) {
  const std::string out = fresh_dir("tiny_q8");
  convert_tiny(out, "8:32", 8);
  EXPECT_TRUE(fs::exists(out + "/tokenizer.json"));
  EXPECT_TRUE(fs::exists(out + "/tokenizer_config.json"));
  EXPECT_FALSE(fs::exists(out + "/.gyre-job"));
  const json cfg = json::parse(read_text_file(out + "/config.json"));
  EXPECT_EQ(cfg["quantization_config"]["quant_method"], "gyre");
  const auto g = gguf_in_f32(kTiny);
  const auto q = load_model(out);
  const auto lg = logits_of(*g, kTinyIds), lq = logits_of(*q, kTinyIds);
  // 8-bit groups of 32: about 1% of a weight's group range; the logits stay within a few %.
  EXPECT_LT(max_diff(lg, lq), 0.05 * max_abs(lg)) << "max |logit| " << max_abs(lg);
  EXPECT_EQ(q->tokenizer->vocab_size(), g->tokenizer->vocab_size());
}

// Layers already on their setting's grid are stored exactly: tiny's Q4_1 tensors converted at
// 4-bit asymmetric g32 dequantize to the exported twin's values (to FP16 rounding), whatever GPTQ
// and the target correction would have made of them; the other layers are quantized as usual.
TEST(ConvertGguf, LayersOnTheirGridAreStoredExactly) {
  const std::string twin = fresh_dir("tiny_grid_twin"), out = fresh_dir("tiny_grid");
  export_gguf_as_hf(kTiny, twin);
  convert_tiny(out, "4:32:asym", 0);
  const auto t = load_model(twin), q = load_model(out);
  QuantSetting st;
  st.bits = 4;
  st.group_size = 32;
  st.sym = false;
  int exact = 0, other = 0;
  for (const auto& [name, w] : q->weights.all()) {
    if (w.dtype != DType::QPACKED) continue;
    const std::vector<float> fq = tensor_to_f32(w), ft = tensor_to_f32(t->weights.get(name));
    double amax = 0.0, diff = 0.0;
    for (size_t i = 0; i < ft.size(); ++i) {
      amax = std::max(amax, std::fabs(double{ft[i]}));
      diff = std::max(diff, std::fabs(double{fq[i]} - ft[i]));
    }
    if (rtn_exact(ft.data(), w.rows(), w.cols(), st)) {
      ++exact;
      EXPECT_LE(diff, amax * 0x1p-9) << name;
    } else {
      ++other;
      EXPECT_GT(diff, amax * 0x1p-9) << name << " (not on the grid, so not reproduced)";
    }
  }
  EXPECT_GE(exact, 4) << "tiny_llama.gguf has four Q4_1 tensors";
  EXPECT_GE(other, 1);
}

// The real SmolLM2 GGUF (skipped when models/ lacks it): the exported folder tokenizes and
// renders the chat template as transformers did, and its logits match transformers' float32
// logits of the same GGUF up to the F16 rounding of the weights.
TEST(ConvertGguf, SmolLM2TwinMatchesTransformers) {
  if (!file_exists(kSmol)) GTEST_SKIP() << "no " << kSmol;
  const std::string out = fresh_dir("smol_twin");
  export_gguf_as_hf(kSmol, out);
  const auto h = load_model(out);
  EXPECT_TRUE(h->config.tie_embeddings);
  const json ref = json::parse(
      read_text_file(std::string(GYRE_SOURCE_DIR) + "/tests/data/smollm2_hf_reference.json"));
  const auto& chat = ref["cases"][2];
  ASSERT_EQ(chat["text"], "<chat>");
  const std::string rendered =
      render_chat_template(h->chat_template, ref["chat_messages"], true, "", "");
  EXPECT_EQ(h->tokenizer->encode(rendered, false), ids_of(chat["input_ids"]));
  for (const auto& c : ref["cases"]) {
    const auto ids = c["input_ids"].get<std::vector<int32_t>>();
    if (c["text"] != "<chat>") {
      EXPECT_EQ(h->tokenizer->encode(c["text"].get<std::string>(), true),
                std::vector<int>(ids.begin(), ids.end()));
    }
    const auto logits = logits_of(*h, ids);
    const int vocab = h->config.vocab_size;
    for (size_t i = 0; i < ids.size(); ++i) {
      const float* row = &logits[i * static_cast<size_t>(vocab)];
      const auto top = c["top20_ids"][i].get<std::vector<int>>();
      const auto top_logits = c["top20_logits"][i].get<std::vector<float>>();
      EXPECT_EQ(std::max_element(row, row + vocab) - row, top[0]) << "position " << i;
      for (size_t k = 0; k < top.size(); ++k)
        EXPECT_NEAR(row[top[k]], top_logits[k], 2e-2 * std::max(1.0f, std::abs(top_logits[k])));
    }
  }
}

}  // namespace
}  // namespace gyre::quant
