// The quality table of docs/quantization.md (disabled: minutes of CPU time). Run with
//   GYRE_QUANT_TABLE_DIR=/tmp/qt ./build/gyre_tests --gtest_also_run_disabled_tests
//     --gtest_filter='QuantQuality.*'
// It converts stories260K and gyre-ref-25M at every row of the table and prints markdown rows:
// file size, bits per weight of the quantized linear layers, perplexity.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "model/loader.h"
#include "quant/convert.h"
#include "quant_perplexity.h"

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
  const std::vector<Row> rows = {
      {"RTN 4-bit g128", "4:128", true},  {"GPTQ 4-bit g128", "4:128", false},
      {"Gyre mixed 3.0", "", false, 3.0}, {"Gyre mixed 4.0", "", false, 4.0},
      {"Gyre mixed 6.0", "", false, 6.0}, {"Gyre mixed 8.0", "", false, 8.0}};
  auto report = [&](const std::string& label, const std::string& dir, const std::string& bpw) {
    auto m = load_model(dir);
    const auto p = test::quant_perplexity(*m, text, 512, max_tokens, threads);
    std::printf("| %s | %s | %.2f MB | %s | %.3f | %lld |\n", name.c_str(), label.c_str(),
                folder_mb(dir), bpw.c_str(), p.ppl, static_cast<long long>(p.tokens));
    std::fflush(stdout);
  };
  report("original", model, "16");
  std::string measurement;  // the first mixed row's, reused by the others
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string f = root + "/" + name + "_" + std::to_string(i) + "/measurement.json";
    if (measurement.empty() && fs::exists(f)) measurement = f;
  }
  for (const Row& r : rows) {
    const std::string out = root + "/" + name + "_" + std::to_string(&r - rows.data());
    if (!fs::exists(out + "/config.json")) {
      ConvertOptions o;
      o.model = model;
      o.out = out;
      o.threads = threads;
      o.uniform = r.uniform;
      o.rtn = r.rtn;
      o.bpw = r.bpw > 0 ? r.bpw : 4.0;
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
  std::printf("| model | weights | size | bpw (linear layers) | perplexity | tokens |\n");
  table_for("stories260K", "tinystories-sample.txt", 20000, 2);
  table_for("gyre-ref-25M", "wikitext2-test.txt", 20000, 2);
}

}  // namespace
}  // namespace gyre::quant
