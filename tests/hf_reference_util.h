// Loading the transformers reference models and logits of tests/data (made by
// tools/make_hf_reference.py), shared by the CPU and CUDA reference tests.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace gyre::testing {

inline const std::vector<std::string>& hf_tiny_variants() {
  static const std::vector<std::string> v = {
      "llama3_gqa_ropescaled",  "llama2_linear_rope", "llama2_dynamic_ntk",
      "mistral_sliding_window", "qwen2_bias",         "qwen2_yarn"};
  return v;
}

struct HfTinyModel {
  ModelConfig config;
  WeightSet weights;
  std::vector<int32_t> input_ids;
  std::vector<std::vector<float>> logits;  // [position][vocab]
};

inline std::unique_ptr<HfTinyModel> load_hf_tiny(const std::string& variant) {
  const std::string dir = std::string(GYRE_SOURCE_DIR) + "/tests/data/hf_tiny/" + variant;
  auto m = std::make_unique<HfTinyModel>();
  const auto cfg = nlohmann::json::parse(read_text_file(dir + "/config.json"));
  const auto gen = nlohmann::json::parse(read_text_file(dir + "/generation_config.json"));
  m->config = config_from_hf_json(cfg, &gen);
  safetensors_load(dir + "/model.safetensors", m->weights);
  const auto ref = nlohmann::json::parse(read_text_file(dir + "/reference.json"));
  m->input_ids = ref["input_ids"].get<std::vector<int32_t>>();
  m->logits = ref["logits"].get<std::vector<std::vector<float>>>();
  return m;
}

// max |a - b| / max |b| over a row.
inline double rel_max_error(const float* a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num = std::max(num, static_cast<double>(std::abs(a[i] - b[i])));
    den = std::max(den, static_cast<double>(std::abs(b[i])));
  }
  return num / den;
}

}  // namespace gyre::testing
