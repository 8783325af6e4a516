#pragma once
// Timing diagnostics: GYRE_DIAG_SKIP names, comma-separated, decode-step launches to leave out
// (attn, attnonly, rope, onekey, head; attnwork: the attention launched but empty), so that a
// bench can price what they cost inside the recorded step; results are wrong while any of those is
// set. headnorm (results unchanged): the LM head's norm runs as its own kernel instead of inside
// the head's matmul.
#include <cstdlib>
#include <string_view>

namespace gyre {

inline bool diag_skip(std::string_view what) {
  static const char* const list = std::getenv("GYRE_DIAG_SKIP");
  if (list == nullptr) return false;
  std::string_view rest(list);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    if (rest.substr(0, comma) == what) return true;
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return false;
}

}  // namespace gyre
