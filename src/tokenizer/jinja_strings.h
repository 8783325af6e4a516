// Python string operations used by the Jinja engine's filters and str methods. Case mapping and
// whitespace are ASCII-only (non-ASCII bytes pass through unchanged).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace gyre::jinja {

inline constexpr const char* kWhitespace = " \t\n\r\v\f\x1c\x1d\x1e\x1f";

// Strips any of the code points in `chars` (a UTF-8 string) from the chosen ends.
std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right);
std::string ascii_upper(std::string s);
std::string ascii_lower(std::string s);
std::string python_title(const std::string& s);  // str.title()
std::string jinja_title(const std::string& s);   // the |title filter
std::string capitalize(const std::string& s);
std::vector<std::string> split_on(const std::string& s, const std::string& sep, int64_t maxsplit);
std::vector<std::string> split_whitespace(const std::string& s, int64_t maxsplit);
std::vector<std::string> split_lines(const std::string& s);
std::string replace_all(const std::string& s, const std::string& from, const std::string& to,
                        int64_t count);
bool char_class_test(const std::string& s, const std::string& method);  // isdigit, isalpha, ...

}  // namespace gyre::jinja
