// Text generation: prefill in chunks, then one token at a time through the sampler, streaming
// text through StreamDecoder and stopping on EOS ids, stop strings, a token budget or a full
// context.
//
// The generator remembers which tokens its Transformer's KV cache holds, so a later prompt that
// starts with the same tokens (the next turn of a chat) only prefills the new part.
#pragma once
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampler.h"
#include "engine/transformer.h"
#include "tokenizer/tokenizer.h"

namespace gyre {

enum class FinishReason { Eos, StopString, Length, ContextFull, Cancelled };
// "eos", "stop", "length", "context_full", "cancelled"
const char* finish_reason_name(FinishReason r);

struct GenerationSettings {
  int max_tokens = 256;  // generated tokens at most; <= 0: until EOS or the context is full
  std::vector<std::string> stop_strings;  // never part of the returned or streamed text
  std::vector<int> stop_ids;              // extra ids that end generation like EOS
  bool ignore_eos = false;                // ignore the config's and tokenizer's EOS ids
  int prefill_chunk = 512;                // prompt tokens per forward pass
  SamplerSettings sampler;
};

struct GenerationStats {
  int prompt_tokens = 0;
  int cached_tokens = 0;     // prompt tokens reused from the KV cache (not prefilled again)
  int generated_tokens = 0;  // sampled tokens, including an EOS/stop id that ended the run
  double prefill_s = 0, prefill_tok_s = 0;
  double decode_s = 0, decode_tok_s = 0;  // single-token forward passes after the prefill
};

struct GenerationResult {
  std::vector<int> prompt_ids;
  std::vector<int> tokens;  // generated ids; an EOS/stop id that ended the run is not included
  std::string text;         // streamed text of `tokens`, cut before a stop string
  FinishReason finish = FinishReason::Length;
  GenerationStats stats;
};

// Holds back streamed text that might be the start of a stop string, and cuts the text at the
// first stop string. Concatenating every push() result and finish() gives the whole text up to
// (not including) the earliest stop string, however the text was split into pieces.
class StopStringFilter {
 public:
  explicit StopStringFilter(std::vector<std::string> stops);
  // Returns the text that is now safe to emit. After a stop string was found, returns "" and
  // stopped() is true.
  std::string push(std::string_view piece);
  // End of text: returns whatever was held back (unless stopped).
  std::string finish();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;  // text not yet emitted: a possible start of a stop string
  bool stopped_ = false;
};

// Receives text as it becomes final (whole UTF-8 characters, never a stop string).
using TextCallback = std::function<void(std::string_view)>;

class Generator {
 public:
  Generator(Transformer& model, const Tokenizer& tokenizer);

  // Encodes the prompt with the tokenizer's special tokens (BOS) and generates.
  GenerationResult generate(std::string_view prompt, const GenerationSettings& s,
                            const TextCallback& on_text = {});
  // Generates from prompt ids as given. Throws gyre::Error on an empty prompt, a prompt that
  // does not fit the context, or an id outside the vocabulary.
  GenerationResult generate_ids(const std::vector<int>& prompt_ids, const GenerationSettings& s,
                                const TextCallback& on_text = {});

  // Checks a prompt before any work: not empty, fits the context, ids in the vocabulary.
  static void check_prompt(const std::vector<int>& prompt_ids, int max_seq, int vocab_size);

  // The ids that end generation for these settings (config and tokenizer EOS, plus stop_ids).
  std::vector<int> end_ids(const GenerationSettings& s) const;

 private:
  // Runs prompt ids from `start` on in chunks; the last one's logits stay on the backend.
  void prefill(const std::vector<int>& ids, int start, int chunk);

  Transformer& model_;
  const Tokenizer& tok_;
  std::vector<int> cached_;  // the tokens whose keys and values the KV cache holds, in order
};

}  // namespace gyre
