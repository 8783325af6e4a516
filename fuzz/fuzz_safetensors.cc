// libFuzzer target: the safetensors parser on arbitrary bytes. Any outcome but gyre::Error or
// success is a bug.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    gyre::WeightSet w;
    gyre::safetensors_parse(data, size, "fuzz.safetensors", w);
  } catch (const gyre::Error&) {
  }
  return 0;
}
