#include "tokenizer/jinja_strings.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "core/error.h"
#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_value.h"

namespace gyre::jinja {
namespace {

bool is_ws(char c) {
  return c != '\0' && std::strchr(kWhitespace, c) != nullptr;
}
bool is_alpha(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) != 0;
}

}  // namespace

std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right) {
  const auto set = utf8_chars(chars);
  const auto cps = utf8_chars(s);
  auto in_set = [&](const std::string& c) {
    return std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t lo = 0, hi = cps.size();
  if (left)
    while (lo < hi && in_set(cps[lo])) ++lo;
  if (right)
    while (hi > lo && in_set(cps[hi - 1])) --hi;
  std::string out;
  for (size_t i = lo; i < hi; ++i) out += cps[i];
  return out;
}

std::string ascii_upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string ascii_lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string python_title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    if (is_alpha(c)) {
      c = static_cast<char>(prev_cased ? std::tolower(static_cast<unsigned char>(c))
                                       : std::toupper(static_cast<unsigned char>(c)));
      prev_cased = true;
    } else {
      prev_cased = false;
    }
  }
  return out;
}

std::string jinja_title(const std::string& s) {
  // jinja2 splits on runs of [-\s({\[<] and upper-cases the first character of every piece.
  auto is_delim = [](char c) {
    return is_ws(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
  };
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    const bool delim = is_delim(s[i]);
    while (j < s.size() && is_delim(s[j]) == delim) ++j;
    std::string piece = s.substr(i, j - i);
    out += delim ? piece : capitalize(piece);
    i = j;
  }
  return out;
}

std::string capitalize(const std::string& s) {
  std::string out = ascii_lower(s);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

std::vector<std::string> split_on(const std::string& s, const std::string& sep, int64_t maxsplit) {
  if (sep.empty()) fail("chat template: split(): empty separator");
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t at = s.find(sep);
       at != std::string::npos && (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit);
       at = s.find(sep, start)) {
    out.push_back(s.substr(start, at - start));
    start = at + sep.size();
  }
  out.push_back(s.substr(start));
  return out;
}

std::vector<std::string> split_whitespace(const std::string& s, int64_t maxsplit) {
  std::vector<std::string> out;
  size_t i = 0;
  while (true) {
    while (i < s.size() && is_ws(s[i])) ++i;
    if (i >= s.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      size_t end = s.size();
      while (end > i && is_ws(s[end - 1])) --end;
      out.push_back(s.substr(i, end - i));
      break;
    }
    size_t j = i;
    while (j < s.size() && !is_ws(s[j])) ++j;
    out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0, start = 0;
  while (i < s.size()) {
    if (s[i] == '\n' || s[i] == '\r') {
      out.push_back(s.substr(start, i - start));
      i += (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ? 2 : 1;
      start = i;
    } else {
      ++i;
    }
  }
  if (start < s.size()) out.push_back(s.substr(start));
  return out;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to,
                        int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between every character (and at both ends).
    const auto cps = utf8_chars(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) out += to, ++done;
      if (i < cps.size()) out += cps[i];
      if (out.size() > kMaxStringBytes) fail("chat template: string too long");
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  for (size_t at = s.find(from); at != std::string::npos && (count < 0 || done < count);
       at = s.find(from, start)) {
    out.append(s, start, at - start);
    out += to;
    if (out.size() > kMaxStringBytes) fail("chat template: string too long");
    start = at + from.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

bool char_class_test(const std::string& s, const std::string& method) {
  if (s.empty()) return false;
  bool any_cased = false;
  for (unsigned char c : s) {
    if (method == "isdigit" && !std::isdigit(c)) return false;
    if (method == "isalpha" && !std::isalpha(c)) return false;
    if (method == "isalnum" && !std::isalnum(c)) return false;
    if (method == "isspace" && !is_ws(static_cast<char>(c))) return false;
    if (method == "islower" && std::isupper(c)) return false;
    if (method == "isupper" && std::islower(c)) return false;
    any_cased = any_cased || std::isalpha(c);
  }
  return (method == "islower" || method == "isupper") ? any_cased : true;
}

}  // namespace gyre::jinja
