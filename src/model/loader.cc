#include "model/loader.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_file.h"
#include "core/mapped_file.h"
#include "model/exl2.h"
#include "model/gguf_loader.h"
#include "model/gptq.h"
#include "model/gyre_quant_loader.h"
#include "model/safetensors.h"

namespace gyre {

namespace fs = std::filesystem;

namespace {

bool is_gguf(const std::string& path) {
  return fs::is_regular_file(path) && path.size() > 5 && path.substr(path.size() - 5) == ".gguf";
}

// Shard file names from model.safetensors.index.json, each checked to stay inside the folder.
std::vector<std::string> shard_files(const std::string& dir) {
  const std::string index = dir + "/model.safetensors.index.json";
  if (!file_exists(index)) {
    const std::string single = dir + "/model.safetensors";
    GYRE_CHECK(file_exists(single), "'", dir,
               "' has neither model.safetensors nor model.safetensors.index.json");
    return {single};
  }
  const nlohmann::json j = read_json_file(index);
  GYRE_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), "'", index,
             "' has no weight_map object");
  std::vector<std::string> files;
  for (const auto& [name, file] : j["weight_map"].items()) {
    GYRE_CHECK(file.is_string(), "'", index, "': weight_map entry '", name, "' is not a string");
    const std::string f = file.get<std::string>();
    GYRE_CHECK(!f.empty() && f.find('/') == std::string::npos && f != "." && f != "..", "'", index,
               "': shard name '", f, "' is not a plain file name");
    bool seen = false;
    for (const auto& g : files) seen = seen || g == dir + "/" + f;
    if (!seen) files.push_back(dir + "/" + f);
  }
  GYRE_CHECK(!files.empty(), "'", index, "' names no shards");
  return files;
}

std::string chat_template_from(const nlohmann::json& tc) {
  if (!tc.is_object() || !tc.contains("chat_template")) return {};
  const auto& t = tc["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array())  // [{name, template}, ...]: use "default"
    for (const auto& e : t)
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
          e["template"].is_string())
        return e["template"].get<std::string>();
  return {};
}

}  // namespace

std::unique_ptr<LoadedModel> load_model(const std::string& path) {
  auto m = std::make_unique<LoadedModel>();
  m->path = path;
  if (is_gguf(path)) {
    m->format = "gguf";
    gguf_load_model(path, *m);
    return m;
  }
  GYRE_CHECK(fs::is_directory(path), "'", path, "' is neither a model folder nor a .gguf file");
  m->format = "hf";
  const std::string cfg_path = path + "/config.json";
  GYRE_CHECK(file_exists(cfg_path), "'", path, "' has no config.json");
  const nlohmann::json cfg = read_json_file(cfg_path);
  nlohmann::json gen;
  const bool has_gen = file_exists(path + "/generation_config.json");
  if (has_gen) gen = read_json_file(path + "/generation_config.json");
  m->config = config_from_hf_json(cfg, has_gen ? &gen : nullptr);
  // Gyre's own format and EXL2 first: the GPTQ reader rejects every other quantization_config.
  GptqConfig gptq;
  Exl2Config exl2;
  if (is_gyre_quantized(cfg)) {
    // `gyre convert` output: the packed tensors are read into a side set that the model's
    // WeightSet keeps alive, and come out as ordinary weights (model/gyre_quant_loader.h).
    auto raw = std::make_shared<std::pair<WeightSet, std::vector<uint8_t>>>();
    for (const std::string& f : shard_files(path)) safetensors_load(f, raw->first);
    gyre_quant_load(cfg, raw->first, m->weights, path);
    m->weights.keep(std::shared_ptr<std::vector<uint8_t>>(raw, &raw->second));
  } else if (exl2_config_from_hf(cfg, exl2)) {
    // Layers of one or two widths stay quantized (QPACKED), others become F16 (model/exl2.h).
    auto raw = std::make_shared<WeightSet>();
    for (const std::string& f : shard_files(path)) safetensors_load(f, *raw);
    exl2_load_weights(m->config, std::move(raw), m->weights);
    m->format = "exl2";
  } else if (gptq_config_from_hf(cfg, gptq)) {
    auto raw = std::make_shared<WeightSet>();
    for (const std::string& f : shard_files(path)) safetensors_load(f, *raw);
    gptq_load_weights(gptq, std::move(raw), m->weights);
    m->format = "gptq";
  } else {
    for (const std::string& f : shard_files(path)) safetensors_load(f, m->weights);
  }
  weights_validate(m->weights, m->config);
  m->tokenizer = Tokenizer::from_folder(path);
  if (file_exists(path + "/tokenizer_config.json"))
    m->chat_template = chat_template_from(read_json_file(path + "/tokenizer_config.json"));
  if (m->config.eos_ids.empty())
    for (int e : m->tokenizer->eos_ids()) m->config.eos_ids.push_back(e);
  return m;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  if (is_gguf(path)) return gguf_load_tokenizer(path);
  GYRE_CHECK(fs::is_directory(path), "'", path, "' is neither a folder nor a .gguf file");
  return Tokenizer::from_folder(path);
}

}  // namespace gyre
