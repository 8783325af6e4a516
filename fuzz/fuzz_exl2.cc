// libFuzzer target: an EXL2 layer (the tensors layer.q_weight, layer.q_scale, layer.q_scale_max,
// layer.q_groups, layer.q_invperm and optionally layer.q_perm of a safetensors file) dequantized
// by model/exl2.h, then kept quantized (one packed weight, or a mix of a part per width with
// padded last groups, validated). Any outcome but gyre::Error or success is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/cpu/qmixed.h"
#include "core/error.h"
#include "model/exl2.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    gyre::WeightSet w;
    gyre::safetensors_parse(data, size, "fuzz.safetensors", w);
    auto find = [&](const char* part) {
      const std::string n = std::string("layer.") + part;
      return w.has(n) ? &w.get(n) : nullptr;
    };
    const gyre::Exl2Tensors t{find("q_weight"), find("q_scale"),   find("q_scale_max"),
                              find("q_groups"), find("q_invperm"), find("q_perm")};
    gyre::exl2_dequantize("fuzz", t, -1);
    const gyre::Exl2Quantized q = gyre::exl2_quantize_layer("fuzz", t, -1);
    if (q.mixed) gyre::qmixed_validate(*q.mixed);
  } catch (const gyre::Error&) {
  }
  return 0;
}
