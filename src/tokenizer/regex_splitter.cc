#include "tokenizer/regex_splitter.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>

#include "core/error.h"

namespace gyre::tok {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2 differs from Llama 3 only in taking digits one at a time.
const char* const kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

RegexSplitter::RegexSplitter(const std::string& pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(error, msg, sizeof msg);
    fail("tokenizer: pre-tokenizer regex does not compile at offset ", offset, ": ",
         reinterpret_cast<const char*>(msg));
  }
  // JIT is only a speed-up; matching falls back to the interpreter when it is unavailable.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = code;
}

RegexSplitter::~RegexSplitter() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

void RegexSplitter::split(std::string_view text, std::vector<std::string_view>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(code, nullptr), &pcre2_match_data_free);
  GYRE_CHECK(md != nullptr, "tokenizer: out of memory for regex match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0, piece_start = 0;
  // The text was validated once by the caller; skip PCRE2's per-call UTF check.
  uint32_t options = PCRE2_NO_UTF_CHECK;
  while (pos <= text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), pos, options, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail("tokenizer: regex match failed: ", reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t start = ov[0], end = ov[1];
    if (start > piece_start) out.push_back(text.substr(piece_start, start - piece_start));
    if (end > start) {
      out.push_back(text.substr(start, end - start));
      pos = end;
    } else {
      // Empty match: step over one whole character so matching always advances.
      if (start >= text.size()) break;
      size_t step = 1;
      while (start + step < text.size() &&
             (static_cast<uint8_t>(text[start + step]) & 0xC0) == 0x80)
        ++step;
      pos = start + step;
      piece_start = start;  // the skipped character stays in the next gap piece
      continue;
    }
    piece_start = end;
  }
  if (piece_start < text.size()) out.push_back(text.substr(piece_start));
}

}  // namespace gyre::tok
