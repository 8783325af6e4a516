#include "engine/generator.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace gyre {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Eos:
      return "eos";
    case FinishReason::StopString:
      return "stop";
    case FinishReason::Length:
      return "length";
    case FinishReason::ContextFull:
      return "context_full";
    case FinishReason::Cancelled:
      return "cancelled";
  }
  return "unknown";
}

StopStringFilter::StopStringFilter(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const std::string& s : stops_) GYRE_CHECK(!s.empty(), "a stop string must not be empty");
}

std::string StopStringFilter::push(std::string_view piece) {
  if (stopped_) return {};
  pending_.append(piece);
  // Any stop string lies wholly inside pending_: text leaves pending_ only once no suffix
  // starting in it can begin a stop string.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    std::string out = pending_.substr(0, first);
    pending_.clear();
    stopped_ = true;
    return out;
  }
  // Hold the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    const size_t max_len = std::min(pending_.size(), s.size() - 1);
    for (size_t len = max_len; len > hold; --len)
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStringFilter::finish() {
  if (stopped_) return {};
  std::string out;
  out.swap(pending_);
  return out;
}

Generator::Generator(Transformer& model, const Tokenizer& tokenizer)
    : model_(model), tok_(tokenizer) {}

void Generator::check_prompt(const std::vector<int>& ids, int max_seq, int vocab_size) {
  GYRE_CHECK(!ids.empty(),
             "the prompt is empty: it encodes to no tokens and the tokenizer adds no BOS");
  GYRE_CHECK(ids.size() <= static_cast<size_t>(max_seq), "the prompt has ", ids.size(),
             " tokens, more than the context of ", max_seq, " tokens (see --max-seq-len)");
  for (int id : ids)
    GYRE_CHECK(id >= 0 && id < vocab_size, "prompt token id ", id, " is outside the vocabulary of ",
               vocab_size);
}

std::vector<int> Generator::end_ids(const GenerationSettings& s) const {
  std::vector<int> ids = s.stop_ids;
  if (!s.ignore_eos) {
    for (int id : model_.config().eos_ids) ids.push_back(id);
    for (int id : tok_.eos_ids()) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

void Generator::prefill(const std::vector<int>& ids, int start, int chunk) {
  const int n_total = static_cast<int>(ids.size());
  for (int pos = start; pos < n_total; pos += chunk) {
    const int n = std::min(chunk, n_total - pos);
    model_.forward(ids.data() + pos, n, pos, nullptr, false);  // sampled on the backend
    cached_.insert(cached_.end(), ids.begin() + pos, ids.begin() + pos + n);
  }
}

GenerationResult Generator::generate(std::string_view prompt, const GenerationSettings& s,
                                     const TextCallback& on_text) {
  return generate_ids(tok_.encode(prompt, true), s, on_text);
}

GenerationResult Generator::generate_ids(const std::vector<int>& prompt_ids,
                                         const GenerationSettings& s, const TextCallback& on_text) {
  using Clock = std::chrono::steady_clock;
  const int vocab = model_.config().vocab_size;
  const int max_seq = model_.max_seq();
  check_prompt(prompt_ids, max_seq, vocab);
  GYRE_CHECK(s.prefill_chunk > 0, "prefill chunk must be positive");
  Sampler sampler(s.sampler);
  StopStringFilter stops(s.stop_strings);
  const std::vector<int> end = end_ids(s);
  for (int id : prompt_ids) sampler.accept(id);

  GenerationResult r;
  r.prompt_ids = prompt_ids;
  auto emit = [&](const std::string& text) {
    if (text.empty()) return;
    r.text += text;
    if (on_text) on_text(text);
  };

  // Reuse the cached prefix; at least the last prompt token runs again to give fresh logits.
  size_t reuse = 0;
  while (reuse < cached_.size() && reuse < prompt_ids.size() && cached_[reuse] == prompt_ids[reuse])
    ++reuse;
  reuse = std::min(reuse, prompt_ids.size() - 1);
  cached_.resize(reuse);

  try {
    const auto t0 = Clock::now();
    prefill(prompt_ids, static_cast<int>(reuse), s.prefill_chunk);
    const auto t1 = Clock::now();

    // Decoding starts after the last prompt token so that the first piece keeps its leading
    // space (decoders strip it from the first token of a sequence); that token's own text
    // is dropped.
    StreamDecoder decoder(tok_, true);
    decoder.push(prompt_ids.back());
    int decode_steps = 0;
    bool stopped = false;
    // Takes a picked id; false: generation ends here (the id itself is not decoded).
    auto take = [&](int id) {
      ++r.stats.generated_tokens;
      if (std::binary_search(end.begin(), end.end(), id)) {
        r.finish = FinishReason::Eos;
        return false;
      }
      sampler.accept(id);
      r.tokens.push_back(id);
      emit(stops.push(decoder.push(id)));
      if (stops.stopped()) {
        r.finish = FinishReason::StopString;
        stopped = true;
        return false;
      }
      if (s.max_tokens > 0 && r.tokens.size() >= static_cast<size_t>(s.max_tokens)) {
        r.finish = FinishReason::Length;
        return false;
      }
      if (cached_.size() >= static_cast<size_t>(max_seq)) {
        r.finish = FinishReason::ContextFull;
        return false;
      }
      return true;
    };
    // On the backend: only the id comes back (Backend::sample, the host reference on the CPU).
    auto sample = [&] {
      const SampleRequest request = sampler.next_request();
      SampleResult sampled;
      model_.sample_logits(&request, 1, &sampled);
      GYRE_CHECK(sampled.error.empty(), sampled.error);
      return sampled.id;
    };
    int id = sample();
    bool more = take(id);
    if (more && sampler.no_penalties()) {
      // Each step's pick may feed the next on the backend; take() sees the ids in order.
      const int budget = max_seq - static_cast<int>(cached_.size());
      model_.decode_fed(
          id, static_cast<int>(cached_.size()), budget, [&] { return sampler.next_request(); },
          [&](int next) {
            cached_.push_back(id);
            ++decode_steps;
            id = next;
            return take(next);
          });
    } else {
      while (more) {
        model_.forward(&id, 1, static_cast<int>(cached_.size()), nullptr, false);
        cached_.push_back(id);
        ++decode_steps;
        id = sample();
        more = take(id);
      }
    }
    if (!stopped) {
      emit(stops.push(decoder.flush()));
      if (stops.stopped())
        r.finish = FinishReason::StopString;
      else
        emit(stops.finish());
    }
    const auto t2 = Clock::now();

    GenerationStats& st = r.stats;
    st.prompt_tokens = static_cast<int>(prompt_ids.size());
    st.cached_tokens = static_cast<int>(reuse);
    st.prefill_s = std::chrono::duration<double>(t1 - t0).count();
    st.decode_s = std::chrono::duration<double>(t2 - t1).count();
    const int prefilled = st.prompt_tokens - st.cached_tokens;
    st.prefill_tok_s = st.prefill_s > 0 ? prefilled / st.prefill_s : 0;
    st.decode_tok_s = st.decode_s > 0 ? decode_steps / st.decode_s : 0;
  } catch (...) {
    cached_.clear();  // the cache may hold part of a chunk we did not record
    throw;
  }
  return r;
}

}  // namespace gyre
