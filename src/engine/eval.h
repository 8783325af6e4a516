// Quality measurement over a text: perplexity of one model, and the KL divergence of a model's
// next-token distributions from a reference model's (e.g. quantized vs unquantized). The CLI
// commands `gyre perplexity` / `gyre kld` and the quantizer call these.
//
// Windows. The text is tokenized once, without special tokens; each window is [BOS] + a segment
// of ctx - 1 consecutive tokens (ctx tokens when the tokenizer has no BOS), so logits at window
// position p predict the token at p + 1. Two scoring rules:
//   * second half (default; llama.cpp's `perplexity`): segments start every ctx tokens (the
//     token under llama.cpp's BOS is skipped exactly as it is there), only whole windows are
//     used, and a window scores its targets at positions ctx/2 + 1 .. ctx - 1, so every scored
//     token has at least half a window of context. With a stride s, windows start every s tokens
//     and each scores the targets no earlier window scored (still at positions > ctx/2).
//   * all (the gyre-ref-25M protocol): segments of ctx - 1 tokens start every ctx - 1 tokens
//     (or every stride), the last one may be shorter, and every target not scored by an earlier
//     window is scored (the first window's from position 1).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/transformer.h"
#include "tokenizer/tokenizer.h"

namespace gyre {

struct EvalOptions {
  int ctx = 512;
  int stride = 0;       // 0: the rule's default (non-overlapping)
  int max_windows = 0;  // 0: every window
  bool score_all = false;
};

struct EvalWindow {
  std::vector<int32_t> tokens;  // BOS (when any) + segment
  int first_target = 1;         // scored targets are tokens[first_target .. size - 1]
};

// Throws on options that make no sense (ctx < 2, stride out of range) or a text too short for
// one window.
std::vector<EvalWindow> make_eval_windows(const std::vector<int>& tokens, int bos_id,
                                          const EvalOptions& o);
std::vector<EvalWindow> make_eval_windows(const Tokenizer& tok, const std::string& text,
                                          const EvalOptions& o);

// Fills logits [tokens.size() * vocab] with every position's logits of one window.
using WindowLogits = std::function<void(const std::vector<int32_t>& tokens, float* logits)>;
// A Transformer as WindowLogits (each window from position 0; max_seq must hold a window).
WindowLogits transformer_logits(Transformer& t);

// Sums of the negative log-likelihood (nats) of scored tokens.
struct NllStats {
  double sum = 0, sum_sq = 0;
  int64_t count = 0;
  void add(double nll);
  double mean() const;
  double ppl() const;
  double stderr_of_mean() const;  // of the mean NLL, tokens taken as independent
  // Standard error of the PPL: ppl * stderr of the mean NLL (as llama.cpp reports it).
  double ppl_stderr() const;
};

// Called after each window: (windows done, windows in all, stats so far).
using EvalProgress = std::function<void(int, int, const NllStats&)>;

NllStats evaluate_perplexity(const std::vector<EvalWindow>& windows, int vocab,
                             const WindowLogits& model, const EvalProgress& progress = {});

struct KldResult {
  NllStats ref, model;  // perplexities of both over the same tokens
  // Per token, model NLL - reference NLL: its mean is ln(model ppl / reference ppl), and its
  // standard error is far smaller than either perplexity's, since both models find the same
  // tokens hard (paired difference).
  NllStats delta;
  std::vector<double> kld;  // KL(ref || model) of every scored position, in nats
  int64_t top1_agree = 0;   // positions where both argmaxes are equal
  double mean() const;
  double stderr_of_mean() const;
  double percentile(double p) const;  // p in [0, 100], nearest-rank on the sorted values
  double top1_rate() const;
  // ppl ratio model / reference at exp(mean delta +- z stderr): z 1.96 gives a 95% interval.
  double ppl_ratio_bound(double z) const;
};

KldResult evaluate_kld(const std::vector<EvalWindow>& windows, int vocab, const WindowLogits& ref,
                       const WindowLogits& model,
                       const std::function<void(int, int, const KldResult&)>& progress = {});

// log-softmax of one row in double precision (out has n entries).
void log_softmax(const float* logits, int n, double* out);

}  // namespace gyre
