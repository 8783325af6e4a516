// `gyre convert --synthetic` (quant/synthetic.h) on a tiny shape on the CPU: the whole pipeline
// runs, the choice holds the bit budget, and with --head-bits > 0 the random LM head is GPTQ'd
// too (its layer line is logged; with 0 it is not), so a timed run includes the head's cost.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "core/mapped_file.h"
#include "quant/synthetic.h"

namespace gyre {
namespace {

ModelConfig tiny_shape() {
  ModelConfig c;
  c.arch = "llama";
  c.model_type = "synthetic-tiny";
  c.vocab_size = 300, c.dim = 64, c.hidden_dim = 128, c.n_layers = 2;
  c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 16, c.max_seq_len = 64;
  c.norm_eps = 1e-5f;
  c.rope.theta = 10000.0f;
  c.rope.rot_dim = c.head_dim;
  return c;
}

TEST(QuantSynthetic, TinyConversionQuantizesTheHeadOnlyWhenAsked) {
  for (int head_bits : {6, 0}) {
    SCOPED_TRACE("head bits " + std::to_string(head_bits));
    quant::ConvertOptions o;
    o.out = ::testing::TempDir() + "/gyre_synthetic_" + std::to_string(head_bits);
    std::filesystem::remove_all(o.out);
    o.rows = 2;
    o.length = 16;
    o.threads = 2;
    o.device = "cpu";
    o.chooser = "plain";
    o.head_bits = head_bits;
    o.bpw = 4.0;
    ::testing::internal::CaptureStderr();
    quant::convert_synthetic(tiny_shape(), "tiny", o);
    const std::string log = ::testing::internal::GetCapturedStderr();
    const auto summary = nlohmann::json::parse(read_text_file(o.out + "/conversion.json"));
    EXPECT_EQ(summary.at("head_bits").get<int>(), head_bits);
    const double bpw = summary.at("bits_per_weight").get<double>();
    EXPECT_LE(bpw, 4.0);
    EXPECT_GT(bpw, 3.0);
    EXPECT_EQ(log.find("lm_head") != std::string::npos, head_bits > 0) << log;
    EXPECT_NE(log.find("model.layers.1.mlp.down_proj"), std::string::npos);
    std::filesystem::remove_all(o.out);
  }
}

}  // namespace
}  // namespace gyre
