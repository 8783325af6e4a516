#include "quant/sensitivity.h"

#include <cmath>
#include <cstdio>
#include <mutex>

#include "core/error.h"
#include "engine/eval.h"
#include "quant/gptq.h"
#include "quant/linalg.h"
#include "quant/progress.h"
#include "quant/unit_quant.h"

namespace gyre::quant {

double mean_kl_of_logits(const std::vector<float>& ref_logits, const std::vector<float>& logits,
                         int64_t vocab, int threads) {
  GYRE_CHECK(vocab > 0 && ref_logits.size() == logits.size() &&
                 ref_logits.size() % static_cast<size_t>(vocab) == 0,
             "internal: logit shapes differ");
  const int64_t n = static_cast<int64_t>(ref_logits.size()) / vocab;
  std::mutex mu;
  double sum = 0;
  parallel_ranges(n, threads, [&](int64_t i0, int64_t i1) {
    std::vector<double> lp(static_cast<size_t>(vocab)), lq(static_cast<size_t>(vocab));
    double part = 0;
    for (int64_t i = i0; i < i1; ++i) {
      log_softmax(ref_logits.data() + i * vocab, static_cast<int>(vocab), lp.data());
      log_softmax(logits.data() + i * vocab, static_cast<int>(vocab), lq.data());
      double kl = 0;
      for (int64_t v = 0; v < vocab; ++v) kl += std::exp(lp[v]) * (lp[v] - lq[v]);
      part += kl;
    }
    std::lock_guard<std::mutex> lock(mu);
    sum += part;
  });
  return n > 0 ? sum / static_cast<double>(n) : 0.0;
}

std::map<std::string, UnitSensitivity> measure_sensitivity(const QuantContext& ctx,
                                                           const QuantSetting& probe,
                                                           int max_rows) {
  const LoadedModel& m = *ctx.model;
  const ModelConfig& c = m.config;
  QuantContext sub = ctx;
  if (static_cast<int>(sub.rows.size()) > max_rows) sub.rows.resize(static_cast<size_t>(max_rows));
  const int rows = static_cast<int>(sub.rows.size()), length = static_cast<int>(sub.rows[0].size());
  BlockRunner runner(*ctx.backend, c, rows, length);
  std::vector<BlockWeights> blocks;
  for (int b = 0; b < c.n_layers; ++b) blocks.push_back(block_of(ctx, b));
  const std::vector<float> norm = tensor_to_f32(m.weights.get("model.norm.weight"));
  const bool own_head = !c.tie_embeddings && m.weights.has("lm_head.weight");
  const std::vector<float> head =
      tensor_to_f32(m.weights.get(own_head ? "lm_head.weight" : "model.embed_tokens.weight"));
  const int64_t vocab = static_cast<int64_t>(head.size()) / c.dim;
  // The unquantized inputs of every block, and the reference logits.
  std::vector<std::vector<float>> inputs{embed_rows(sub)};
  for (int b = 0; b < c.n_layers; ++b) {
    std::vector<float> h = inputs.back();
    runner.run(h, blocks[b], nullptr);
    inputs.push_back(std::move(h));
  }
  const std::vector<float> ref = runner.logits(runner.final_norm(inputs.back(), norm), head, vocab);

  std::map<std::string, UnitSensitivity> out;
  Progress bar("sensitivity", int64_t{c.n_layers} * kUnits, ctx.progress);
  for (int b = 0; b < c.n_layers; ++b)
    for (int u = 0; u < kUnits; ++u) {
      const Unit unit = static_cast<Unit>(u);
      UnitSensitivity s;
      bool quantized = false;
      BlockWeights w = blocks[b];
      std::vector<float> h = inputs[b];
      runner.run(h, w, [&](Unit at, const std::vector<float>& x, int64_t tokens, BlockWeights& bw) {
        if (at != unit) return;
        const int in = static_cast<int>(static_cast<int64_t>(x.size()) / tokens);
        QuantSetting st = probe;  // the widest group up to the probe's that fits this width
        while (st.group_size > 32 && in % st.group_size != 0) st.group_size /= 2;
        if (in % st.group_size != 0) return;
        UnitQuantizer uq(ctx);
        uq.set_input(x, tokens);
        for (const std::string& name : unit_linears(unit)) {
          std::vector<float>& wt = bw.t[name];
          double err = 0;
          QuantizedWeight q = uq.quantize(wt, st, &err);
          s.probe_error += err;
          wt = std::move(q.dequant);
        }
        quantized = true;
      });
      if (quantized) {
        for (int later = b + 1; later < c.n_layers; ++later) {
          runner.run(h, blocks[later], nullptr);  // no hook: the weights stay as they are
        }
        s.kl = mean_kl_of_logits(ref, runner.logits(runner.final_norm(h, norm), head, vocab), vocab,
                                 ctx.threads);
        const std::string key = layer_tensor(b, unit_linears(unit)[0].c_str());
        char line[200];
        std::snprintf(line, sizeof(line), "  %-40s KL %.6f rel. error %.6f sensitivity %.4f",
                      key.c_str(), s.kl, s.probe_error, s.sensitivity());
        bar.note(line);
        out[key] = s;
      }
      bar.step();
    }
  bar.finish();
  return out;
}

}  // namespace gyre::quant
