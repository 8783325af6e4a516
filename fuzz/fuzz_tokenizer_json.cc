// libFuzzer target: arbitrary bytes as tokenizer.json. Loading must either succeed or throw
// gyre::Error; a tokenizer that loads must encode, decode and stream a short text without
// crashing.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::unique_ptr<gyre::Tokenizer> tok;
  try {
    tok = gyre::Tokenizer::from_hf(text, nullptr);
  } catch (const gyre::Error&) {
    return 0;
  }
  // A hostile file may still make encoding fail cleanly (a regex hitting its match limit).
  try {
    const std::string sample = "Hello  world!\n\t12345 caf\xC3\xA9 \xF0\x9F\x91\x8D <s>x\xFF";
    for (bool add_special : {false, true}) {
      const std::vector<int> ids = tok->encode(sample, add_special);
      (void)tok->decode(ids, false);
      (void)tok->decode(ids, true);
      gyre::StreamDecoder stream(*tok, true);
      for (int id : ids) (void)stream.push(id);
      (void)stream.flush();
    }
    for (int id = 0; id < tok->vocab_size() && id < 64; ++id)
      (void)tok->token_to_id(tok->id_to_token(id));
  } catch (const gyre::Error&) {
  }
  return 0;
}
