// The architecture table: one row per supported family. Adding a Llama-like family is a new row.
#include <array>
#include <string>

#include "core/error.h"
#include "model/config.h"

namespace gyre {

namespace {
// name, HF architecture, GGUF general.architecture, qkv_bias, sliding window, GGUF q/k interleaved
constexpr std::array<ArchInfo, 3> kArchs = {{
    {"llama", "LlamaForCausalLM", "llama", false, false, true},
    {"mistral", "MistralForCausalLM", "mistral", false, true, true},
    {"qwen2", "Qwen2ForCausalLM", "qwen2", true, true, false},
}};
}  // namespace

const ArchInfo& arch_lookup_hf(const std::string& architecture, const std::string& model_type) {
  for (const ArchInfo& a : kArchs)
    if (architecture == a.hf_architecture || (architecture.empty() && model_type == a.name))
      return a;
  fail("unsupported architecture '", architecture.empty() ? model_type : architecture,
       "' (Gyre supports ", arch_supported_list(), ")");
}

const ArchInfo& arch_lookup_gguf(const std::string& gguf_arch) {
  for (const ArchInfo& a : kArchs)
    if (gguf_arch == a.gguf_arch) return a;
  fail("unsupported GGUF architecture '", gguf_arch, "' (Gyre supports ", arch_supported_list(),
       ")");
}

std::string arch_supported_list() {
  std::string s;
  for (const ArchInfo& a : kArchs) s += std::string(s.empty() ? "" : ", ") + a.hf_architecture;
  return s;
}

}  // namespace gyre
