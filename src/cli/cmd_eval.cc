// `gyre perplexity` and `gyre kld`: thin wrappers over engine/eval.h (windows, scoring rules and
// statistics are documented there).
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "engine/eval.h"

namespace gyre {

namespace {

struct EvalCliOptions {
  ModelOptions model;
  std::string ref, ref_device, text_file;
  EvalOptions eval;
  bool json = false;
};

void add_eval_options(CLI::App* cmd, EvalCliOptions& o) {
  add_model_option(*cmd, o.model);
  add_runtime_options(*cmd, o.model);
  cmd->add_option("-f,--file", o.text_file, "text file to evaluate on (UTF-8)")->required();
  cmd->add_option("--ctx", o.eval.ctx, "tokens per window, BOS included (default 512)");
  cmd->add_option("--stride", o.eval.stride,
                  "start a window every N tokens (default: non-overlapping windows)");
  cmd->add_option("--max-windows", o.eval.max_windows, "evaluate at most N windows (0: all)");
  cmd->add_flag("--score-all", o.eval.score_all,
                "score every token (windows of BOS + ctx-1 tokens, the last one partial) "
                "instead of the second half of whole windows as llama.cpp does");
  cmd->add_flag("--json", o.json, "print the result as one JSON object");
}

nlohmann::json nll_json(const NllStats& s) {
  return {{"ppl", s.ppl()},
          {"ppl_stderr", s.ppl_stderr()},
          {"mean_nll", s.mean()},
          {"tokens", s.count}};
}

nlohmann::json windows_json(const EvalCliOptions& o, size_t windows) {
  return {{"file", o.text_file},
          {"ctx", o.eval.ctx},
          {"stride", o.eval.stride},
          {"rule", o.eval.score_all ? "all" : "second-half"},
          {"windows", windows}};
}

// The KV cache holds exactly one window.
OpenedModel open_for_windows(std::unique_ptr<LoadedModel> m, const ModelOptions& o, int ctx) {
  GYRE_CHECK(o.max_seq_len == 0 || o.max_seq_len >= ctx, "--max-seq-len ", o.max_seq_len,
             " is smaller than --ctx ", ctx);
  return open_model(std::move(m), o, ctx);
}

void run_perplexity(const EvalCliOptions& o) {
  const std::string text = read_text_file(o.text_file);
  auto loaded = load_model(o.model.model);
  const auto windows = make_eval_windows(*loaded->tokenizer, text, o.eval);
  OpenedModel m = open_for_windows(std::move(loaded), o.model, o.eval.ctx);
  const int vocab = m.model->config.vocab_size;
  const NllStats st = evaluate_perplexity(
      windows, vocab, transformer_logits(*m.transformer), [&](int k, int n, const NllStats& s) {
        std::fprintf(stderr, "[%d/%d] ppl %.4f +/- %.4f (%lld tokens)\n", k, n, s.ppl(),
                     s.ppl_stderr(), static_cast<long long>(s.count));
      });
  if (o.json) {
    nlohmann::json j = windows_json(o, windows.size());
    j["model"] = o.model.model;
    j.update(nll_json(st));
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("perplexity %.4f +/- %.4f over %lld tokens in %zu windows (mean NLL %.5f)\n",
                st.ppl(), st.ppl_stderr(), static_cast<long long>(st.count), windows.size(),
                st.mean());
  }
}

void run_kld(const EvalCliOptions& o) {
  const std::string text = read_text_file(o.text_file);
  auto ref_loaded = load_model(o.ref);
  auto model_loaded = load_model(o.model.model);
  GYRE_CHECK(ref_loaded->config.vocab_size == model_loaded->config.vocab_size,
             "vocabularies differ: ", ref_loaded->config.vocab_size, " (reference) and ",
             model_loaded->config.vocab_size);
  // The reference's tokenization is the one both models are scored on.
  const auto windows = make_eval_windows(*ref_loaded->tokenizer, text, o.eval);
  ModelOptions ro = o.model;
  ro.model = o.ref;
  if (!o.ref_device.empty()) ro.device = o.ref_device;
  OpenedModel ref = open_for_windows(std::move(ref_loaded), ro, o.eval.ctx);
  OpenedModel model = open_for_windows(std::move(model_loaded), o.model, o.eval.ctx);
  const KldResult r = evaluate_kld(
      windows, ref.model->config.vocab_size, transformer_logits(*ref.transformer),
      transformer_logits(*model.transformer), [&](int k, int n, const KldResult& s) {
        std::fprintf(stderr, "[%d/%d] mean KLD %.6f, top-1 agreement %.4f, ppl %.4f vs %.4f\n", k,
                     n, s.mean(), s.top1_rate(), s.model.ppl(), s.ref.ppl());
      });
  const double pct[] = {50, 90, 95, 99, 99.9, 100};
  if (o.json) {
    nlohmann::json j = windows_json(o, windows.size());
    j["model"] = o.model.model;
    j["ref"] = o.ref;
    j["device"] = o.model.device;
    j["ref_device"] = o.ref_device.empty() ? o.model.device : o.ref_device;
    j["kld_mean"] = r.mean();
    j["kld_stderr"] = r.stderr_of_mean();
    nlohmann::json p;
    for (double q : pct)
      p[q == 99.9 ? "99.9" : std::to_string(static_cast<int>(q))] = r.percentile(q);
    j["kld_percentiles"] = p;
    j["top1_agreement"] = r.top1_rate();
    j["tokens"] = r.kld.size();
    j["model_ppl"] = nll_json(r.model);
    j["ref_ppl"] = nll_json(r.ref);
    j["ppl_ratio"] = r.model.ppl() / r.ref.ppl();
    j["ln_ppl_ratio"] = r.delta.mean();
    j["ln_ppl_ratio_stderr"] = r.delta.stderr_of_mean();
    j["ppl_ratio_95"] = {r.ppl_ratio_bound(-1.96), r.ppl_ratio_bound(1.96)};
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("KL(ref || model) mean %.6f +/- %.6f nats over %zu tokens in %zu windows\n", r.mean(),
              r.stderr_of_mean(), r.kld.size(), windows.size());
  std::printf("percentiles: p50 %.6f  p90 %.6f  p95 %.6f  p99 %.6f  p99.9 %.6f  max %.6f\n",
              r.percentile(50), r.percentile(90), r.percentile(95), r.percentile(99),
              r.percentile(99.9), r.percentile(100));
  std::printf("top-1 agreement %.4f\n", r.top1_rate());
  std::printf("perplexity: model %.4f +/- %.4f, reference %.4f +/- %.4f (ratio %.5f)\n",
              r.model.ppl(), r.model.ppl_stderr(), r.ref.ppl(), r.ref.ppl_stderr(),
              r.model.ppl() / r.ref.ppl());
  std::printf(
      "paired: ln(ppl ratio) %.5f +/- %.5f per-token NLL difference, ratio 95%% interval "
      "%.5f .. %.5f\n",
      r.delta.mean(), r.delta.stderr_of_mean(), r.ppl_ratio_bound(-1.96), r.ppl_ratio_bound(1.96));
}

}  // namespace

void add_eval_commands(CLI::App& app) {
  auto opts = std::make_shared<EvalCliOptions>();
  CLI::App* ppl = app.add_subcommand("perplexity", "perplexity of a model over a text file");
  add_eval_options(ppl, *opts);
  ppl->callback([opts] { run_perplexity(*opts); });

  auto kopts = std::make_shared<EvalCliOptions>();
  CLI::App* kld = app.add_subcommand(
      "kld", "KL divergence of a model's next-token distributions from a reference model's");
  add_eval_options(kld, *kopts);
  kld->add_option("--ref", kopts->ref, "the reference model (e.g. the unquantized one)")
      ->required();
  kld->add_option("--ref-device", kopts->ref_device,
                  "device of the reference model (default: --device's); e.g. cpu to score a GPU "
                  "run against the CPU's f32 arithmetic, the same model as both");
  kld->callback([kopts] { run_kld(*kopts); });
}

}  // namespace gyre
