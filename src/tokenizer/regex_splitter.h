// A PCRE2 regex (UTF + Unicode properties) used as an "Isolated" split: every match and every
// stretch between matches becomes its own piece.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace gyre::tok {

class RegexSplitter {
 public:
  explicit RegexSplitter(const std::string& pattern);  // throws gyre::Error if it does not compile
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Appends the pieces of `text` (valid UTF-8) to `out`, in order, none empty.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8*, kept opaque so pcre2.h stays out of headers
};

// Well-known split patterns.
extern const char* const kGpt2Pattern;
extern const char* const kLlama3Pattern;
extern const char* const kQwen2Pattern;

}  // namespace gyre::tok
