// The quality table of docs/quantization.md (disabled: minutes of CPU time). Run with
//   GYRE_QUANT_TABLE_DIR=/tmp/qt ./build/gyre_tests --gtest_also_run_disabled_tests
//     --gtest_filter='QuantQuality.*'
// It converts stories260K and gyre-ref-25M at every row of the table and prints markdown rows:
// file size, bits per weight of the quantized linear layers, perplexity, and the mean KL
// divergence and top-1 agreement against the original model (engine/eval.h, the code behind
// `gyre perplexity` and `gyre kld`; every token of each window scored, as --score-all does).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/mapped_file.h"
#include "engine/eval.h"
#include "engine/transformer.h"
#include "model/loader.h"
#include "quant/convert.h"

namespace gyre::quant {
namespace {

namespace fs = std::filesystem;

struct Row {
  std::string label, uniform;
  bool rtn = false;
  double bpw = 0;  // mixed
};

double folder_mb(const std::string& dir) {
  double bytes = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") bytes += static_cast<double>(e.file_size());
  return bytes / 1e6;
}

void table_for(const std::string& name, const std::string& text_file, int64_t max_tokens,
               int threads) {
  const char* root_env = std::getenv("GYRE_QUANT_TABLE_DIR");
  const std::string root = root_env ? root_env : ::testing::TempDir() + "/gyre_quant_table";
  const std::string model = std::string(GYRE_FIXTURES) + "/" + name;
  const std::string text = read_text_file(std::string(GYRE_FIXTURES) + "/text/" + text_file);
  std::vector<Row> rows = {
      {"RTN 4-bit g128", "4:128", true},
      {"GPTQ 4-bit g128", "4:128", false},
      {"Gyre mixed 3.0", "", false, 3.0},
      {"Gyre mixed 4.0", "", false, 4.0},
      {"Gyre mixed 6.0", "", false, 6.0},
      {"Gyre mixed 8.0", "", false, 8.0},
      // At exactly the bits per weight of the uniform GPTQ row (read from its output).
      {"Gyre mixed at GPTQ 4-bit's bpw", "", false, -1.0}};
  // GYRE_QUANT_TABLE_ROWS="o0123456": which rows to run ("o": the original); all by default.
  const char* rows_env = std::getenv("GYRE_QUANT_TABLE_ROWS");
  const std::string pick = rows_env ? rows_env : "o0123456";
  auto original = load_model(model);
  EvalOptions eo;
  eo.ctx = 512;
  eo.score_all = true;
  eo.max_windows = static_cast<int>((max_tokens + eo.ctx - 2) / (eo.ctx - 1));
  const auto windows = make_eval_windows(*original->tokenizer, text, eo);
  auto backend = backend_create("cpu", threads);
  Transformer ref(original->config, original->weights, *backend, eo.ctx);
  auto report = [&](const std::string& label, const std::string& dir, const std::string& bpw) {
    auto m = load_model(dir);
    Transformer tf(m->config, m->weights, *backend, eo.ctx);
    const KldResult r = evaluate_kld(windows, m->config.vocab_size, transformer_logits(ref),
                                     transformer_logits(tf));
    std::printf("| %s | %s | %.2f MB | %s | %.3f | %.5f | %.2f%% | %lld |\n", name.c_str(),
                label.c_str(), folder_mb(dir), bpw.c_str(), r.model.ppl(), r.mean(),
                100.0 * r.top1_rate(), static_cast<long long>(r.model.count));
    std::fflush(stdout);
  };
  if (pick.find('o') != std::string::npos) report("original", model, "16");
  std::string measurement;  // the first mixed row's, reused by the others
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string f = root + "/" + name + "_" + std::to_string(i) + "/measurement.json";
    if (measurement.empty() && fs::exists(f)) measurement = f;
  }
  for (const Row& r : rows) {
    const int index = static_cast<int>(&r - rows.data());
    if (pick.find(static_cast<char>('0' + index)) == std::string::npos) continue;
    const std::string out = root + "/" + name + "_" + std::to_string(index);
    if (!fs::exists(out + "/config.json")) {
      ConvertOptions o;
      o.model = model;
      o.out = out;
      o.threads = threads;
      o.uniform = r.uniform;
      o.rtn = r.rtn;
      o.bpw = r.bpw > 0 ? r.bpw : 4.0;
      if (r.bpw < 0)
        o.bpw = nlohmann::json::parse(read_text_file(
            root + "/" + name + "_1/config.json"))["quantization_config"]["bits_per_weight"]
                    .get<double>();
      o.measurement = r.uniform.empty() ? measurement : "";
      convert_model(o);
      if (r.uniform.empty() && measurement.empty()) measurement = out + "/measurement.json";
    }
    const auto cfg = nlohmann::json::parse(read_text_file(out + "/config.json"));
    char bpw[32];
    std::snprintf(bpw, sizeof(bpw), "%.3f",
                  cfg["quantization_config"]["bits_per_weight"].get<double>());
    report(r.label, out, bpw);
  }
}

TEST(QuantQuality, DISABLED_Table) {
  std::printf(
      "| model | weights | size | bpw (linear layers) | perplexity | mean KLD | top-1 | tokens "
      "|\n");
  const char* models = std::getenv("GYRE_QUANT_TABLE_MODELS");
  const std::string which = models ? models : "stories260K,gyre-ref-25M";
  if (which.find("stories260K") != std::string::npos)
    table_for("stories260K", "tinystories-sample.txt", 20000, 2);
  // 6,132 tokens (12 windows of 512): the CPU evaluation of the 25M model is slow on a shared box.
  if (which.find("gyre-ref-25M") != std::string::npos)
    table_for("gyre-ref-25M", "wikitext2-test.txt", 6000, 2);
}

}  // namespace
}  // namespace gyre::quant
