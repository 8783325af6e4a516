// `gyre convert --synthetic` (quant/synthetic.h) on a tiny shape on the CPU: the whole pipeline
// runs, the choice holds the bit budget, and with --head-bits > 0 the random LM head is GPTQ'd
// too (its layer line is logged; with 0 it is not), so a timed run includes the head's cost.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
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

// A synthetic conversion stopped before its end (the last write fails) resumes from its job
// folder: the measurement, the sensitivity and the quantized blocks are not redone, and the result
// is that of an uninterrupted run. Other options are refused, not mixed in.
TEST(QuantSynthetic, InterruptedConversionResumes) {
  namespace fs = std::filesystem;
  quant::ConvertOptions o;
  o.rows = 2;
  o.length = 16;
  o.threads = 2;
  o.device = "cpu";
  o.head_bits = 0;
  o.bpw = 4.0;
  const std::string base = ::testing::TempDir() + "/gyre_synthetic_resume_" +
                           std::to_string(static_cast<long long>(::getpid()));
  o.out = base + "_a";
  fs::remove_all(o.out);
  ::testing::internal::CaptureStderr();
  quant::convert_synthetic(tiny_shape(), "tiny", o);
  ::testing::internal::GetCapturedStderr();
  const std::string want = read_text_file(o.out + "/measurement.json");

  o.out = base + "_b";
  fs::remove_all(o.out);
  fs::create_directories(o.out + "/measurement.json/x");  // the final write fails once
  ::testing::internal::CaptureStderr();
  EXPECT_THROW(quant::convert_synthetic(tiny_shape(), "tiny", o), Error);
  const std::string first = ::testing::internal::GetCapturedStderr();
  for (const char* s : {"measured in", "sensitivity:", "rel. error"})
    EXPECT_NE(first.find(s), std::string::npos) << s << "\n" << first;
  EXPECT_TRUE(fs::exists(o.out + "/.gyre-job/measurement.json"));
  EXPECT_TRUE(fs::exists(o.out + "/.gyre-job/block_1.safetensors"));
  fs::remove_all(o.out + "/measurement.json");
  ::testing::internal::CaptureStderr();
  quant::convert_synthetic(tiny_shape(), "tiny", o);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("resuming the job"), std::string::npos) << log;
  EXPECT_EQ(log.find("measured in"), std::string::npos) << log;   // no block measured again
  EXPECT_EQ(log.find("sensitivity:"), std::string::npos) << log;  // nor probed
  EXPECT_EQ(log.find("rel. error"), std::string::npos) << log;    // nor quantized
  EXPECT_EQ(read_text_file(o.out + "/measurement.json"), want);
  const auto summary = nlohmann::json::parse(read_text_file(o.out + "/conversion.json"));
  EXPECT_TRUE(summary.at("resumed").get<bool>());

  o.out = base + "_c";
  fs::remove_all(o.out);
  fs::create_directories(o.out + "/measurement.json/x");
  ::testing::internal::CaptureStderr();
  EXPECT_THROW(quant::convert_synthetic(tiny_shape(), "tiny", o), Error);
  fs::remove_all(o.out + "/measurement.json");
  o.bpw = 3.0;
  try {
    quant::convert_synthetic(tiny_shape(), "tiny", o);
    ADD_FAILURE() << "a job of other options was resumed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("other options"), std::string::npos) << e.what();
  }
  ::testing::internal::GetCapturedStderr();
  for (const char* s : {"_a", "_b", "_c"}) fs::remove_all(base + s);
}

}  // namespace
}  // namespace gyre
