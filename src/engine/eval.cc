#include "engine/eval.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace gyre {

std::vector<EvalWindow> make_eval_windows(const std::vector<int>& tokens, int bos_id,
                                          const EvalOptions& o) {
  GYRE_CHECK(o.ctx >= 4, "context of ", o.ctx, " tokens is too small (at least 4)");
  GYRE_CHECK(o.max_windows >= 0, "--max-windows must not be negative");
  const int off = bos_id >= 0 ? 1 : 0;  // window position of segment token 0
  const int64_t seg_len = o.ctx - off;
  const int64_t n = static_cast<int64_t>(tokens.size());
  GYRE_CHECK(o.stride >= 0 && o.stride <= o.ctx, "stride ", o.stride, " must be in 1..", o.ctx,
             " (or 0 for non-overlapping windows)");
  const int64_t step = o.stride > 0 ? o.stride : (o.score_all ? seg_len : o.ctx);
  // First segment index a window may score: its target needs a predictor (position >= 1) and,
  // in the second-half rule, a window position above ctx/2.
  const int64_t min_index = o.score_all ? 1 - off : o.ctx / 2 + 1 - off;
  std::vector<EvalWindow> out;
  int64_t scored_until = 0;  // tokens before this index are scored already
  for (int64_t start = 0; start < n; start += step) {
    const int64_t end = std::min(start + seg_len, n);
    if (!o.score_all && end - start < seg_len) break;  // second-half rule: whole windows only
    const int64_t from = std::max(scored_until, start + min_index);
    if (from < end) {
      EvalWindow w;
      if (off) w.tokens.push_back(bos_id);
      for (int64_t i = start; i < end; ++i) w.tokens.push_back(tokens[static_cast<size_t>(i)]);
      w.first_target = static_cast<int>(from - start + off);
      out.push_back(std::move(w));
      scored_until = end;
      if (o.max_windows > 0 && static_cast<int>(out.size()) == o.max_windows) break;
    }
    if (end == n) break;
  }
  GYRE_CHECK(!out.empty(), "the text has ", n, " tokens: too few for one window of ", o.ctx,
             o.score_all ? "" : " (the second-half rule needs a whole window; try --score-all)");
  return out;
}

std::vector<EvalWindow> make_eval_windows(const Tokenizer& tok, const std::string& text,
                                          const EvalOptions& o) {
  return make_eval_windows(tok.encode(text, false), tok.bos_id(), o);
}

WindowLogits transformer_logits(Transformer& t) {
  return [&t](const std::vector<int32_t>& tokens, float* logits) {
    const int n = static_cast<int>(tokens.size());
    GYRE_CHECK(n <= t.max_seq(), "a window of ", n, " tokens exceeds the model's ", t.max_seq());
    t.forward(tokens.data(), n, 0, logits, true);
  };
}

void NllStats::add(double nll) {
  sum += nll;
  sum_sq += nll * nll;
  ++count;
}

double NllStats::mean() const {
  return count ? sum / static_cast<double>(count) : 0.0;
}

double NllStats::ppl() const {
  return std::exp(mean());
}

double NllStats::stderr_of_mean() const {
  if (count < 2) return 0.0;
  const double m = mean();
  const double var = std::max(0.0, sum_sq / static_cast<double>(count) - m * m);
  return std::sqrt(var / static_cast<double>(count - 1));
}

double NllStats::ppl_stderr() const {
  return ppl() * stderr_of_mean();
}

void log_softmax(const float* logits, int n, double* out) {
  double mx = logits[0];
  for (int i = 1; i < n; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
  double s = 0;
  for (int i = 0; i < n; ++i) s += std::exp(static_cast<double>(logits[i]) - mx);
  const double lse = mx + std::log(s);
  for (int i = 0; i < n; ++i) out[i] = static_cast<double>(logits[i]) - lse;
}

namespace {

int argmax(const float* x, int n) {
  return static_cast<int>(std::max_element(x, x + n) - x);
}

void check_window(const EvalWindow& w) {
  GYRE_CHECK(w.first_target >= 1 && w.first_target < static_cast<int>(w.tokens.size()),
             "evaluation window of ", w.tokens.size(), " tokens scores from position ",
             w.first_target);
}

}  // namespace

NllStats evaluate_perplexity(const std::vector<EvalWindow>& windows, int vocab,
                             const WindowLogits& model, const EvalProgress& progress) {
  NllStats st;
  std::vector<float> logits;
  std::vector<double> lsm(static_cast<size_t>(vocab));
  for (size_t k = 0; k < windows.size(); ++k) {
    const EvalWindow& w = windows[k];
    check_window(w);
    logits.assign(w.tokens.size() * static_cast<size_t>(vocab), 0.0f);
    model(w.tokens, logits.data());
    for (size_t p = static_cast<size_t>(w.first_target); p < w.tokens.size(); ++p) {
      const int target = w.tokens[p];
      GYRE_CHECK(target >= 0 && target < vocab, "token ", target, " is outside the vocabulary");
      log_softmax(logits.data() + (p - 1) * static_cast<size_t>(vocab), vocab, lsm.data());
      st.add(-lsm[static_cast<size_t>(target)]);
    }
    if (progress) progress(static_cast<int>(k + 1), static_cast<int>(windows.size()), st);
  }
  return st;
}

double KldResult::mean() const {
  double s = 0;
  for (double v : kld) s += v;
  return kld.empty() ? 0.0 : s / static_cast<double>(kld.size());
}

double KldResult::stderr_of_mean() const {
  const size_t n = kld.size();
  if (n < 2) return 0.0;
  const double m = mean();
  double ss = 0;
  for (double v : kld) ss += (v - m) * (v - m);
  return std::sqrt(ss / static_cast<double>(n - 1) / static_cast<double>(n));
}

double KldResult::percentile(double p) const {
  if (kld.empty()) return 0.0;
  std::vector<double> s = kld;
  std::sort(s.begin(), s.end());
  const double rank = std::ceil(std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(s.size()));
  const size_t i = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  return s[std::min(i, s.size() - 1)];
}

double KldResult::top1_rate() const {
  return kld.empty() ? 0.0 : static_cast<double>(top1_agree) / static_cast<double>(kld.size());
}

double KldResult::ppl_ratio_bound(double z) const {
  return std::exp(delta.mean() + z * delta.stderr_of_mean());
}

KldResult evaluate_kld(const std::vector<EvalWindow>& windows, int vocab, const WindowLogits& ref,
                       const WindowLogits& model,
                       const std::function<void(int, int, const KldResult&)>& progress) {
  KldResult r;
  std::vector<float> lr, lm;
  std::vector<double> pr(static_cast<size_t>(vocab)), pm(static_cast<size_t>(vocab));
  for (size_t k = 0; k < windows.size(); ++k) {
    const EvalWindow& w = windows[k];
    check_window(w);
    lr.assign(w.tokens.size() * static_cast<size_t>(vocab), 0.0f);
    lm.assign(lr.size(), 0.0f);
    ref(w.tokens, lr.data());
    model(w.tokens, lm.data());
    for (size_t p = static_cast<size_t>(w.first_target); p < w.tokens.size(); ++p) {
      const int target = w.tokens[p];
      GYRE_CHECK(target >= 0 && target < vocab, "token ", target, " is outside the vocabulary");
      const float* a = lr.data() + (p - 1) * static_cast<size_t>(vocab);
      const float* b = lm.data() + (p - 1) * static_cast<size_t>(vocab);
      log_softmax(a, vocab, pr.data());
      log_softmax(b, vocab, pm.data());
      double kl = 0;
      for (int i = 0; i < vocab; ++i) kl += std::exp(pr[i]) * (pr[i] - pm[i]);
      r.kld.push_back(std::max(0.0, kl));  // rounding can make a zero divergence -1e-17
      r.ref.add(-pr[static_cast<size_t>(target)]);
      r.model.add(-pm[static_cast<size_t>(target)]);
      r.delta.add(pr[static_cast<size_t>(target)] - pm[static_cast<size_t>(target)]);
      r.top1_agree += argmax(a, vocab) == argmax(b, vocab);
    }
    if (progress) progress(static_cast<int>(k + 1), static_cast<int>(windows.size()), r);
  }
  return r;
}

}  // namespace gyre
