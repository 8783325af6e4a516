// libFuzzer target: the GGUF parser and the model reader on arbitrary bytes. Any outcome but
// gyre::Error or success (a crash, a sanitizer report, a hang) is a bug.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "model/gguf.h"
#include "model/gguf_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto f = gyre::GgufFile::parse(data, size, "fuzz.gguf");
    try {
      gyre::gguf_read_vocab(*f);
    } catch (const gyre::Error&) {
    }
    const gyre::ModelConfig c = gyre::gguf_read_config(*f);
    gyre::WeightSet w;
    gyre::gguf_read_weights(*f, w);
    gyre::weights_validate(w, c);
  } catch (const gyre::Error&) {
  }
  return 0;
}
