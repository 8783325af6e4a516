#include "model/gguf_loader.h"

#include "model/gguf.h"
#include "model/gguf_model.h"

namespace gyre {

void gguf_load_model(const std::string& path, LoadedModel& out) {
  const auto f = GgufFile::open(path);
  out.config = gguf_read_config(*f);
  gguf_read_weights(*f, out.weights);
  weights_validate(out.weights, out.config);
  out.tokenizer = Tokenizer::from_gguf(gguf_read_vocab(*f));
  out.chat_template = gguf_chat_template(*f);
  if (out.config.eos_ids.empty())
    for (int e : out.tokenizer->eos_ids()) out.config.eos_ids.push_back(e);
}

std::unique_ptr<Tokenizer> gguf_load_tokenizer(const std::string& path) {
  const auto f = GgufFile::open(path);
  return Tokenizer::from_gguf(gguf_read_vocab(*f));
}

}  // namespace gyre
