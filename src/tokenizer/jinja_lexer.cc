#include "tokenizer/jinja_lexer.h"

#include <cctype>
#include <cstring>

#include "core/error.h"
#include "tokenizer/text_util.h"

namespace gyre::jinja {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t start = find_tag_start(pos_);
      std::string text = src_.substr(pos_, start - pos_);
      if (start == src_.size()) {
        emit_data(text);
        pos_ = start;
        break;
      }
      const char kind = src_[start + 1];  // '{', '%' or '#'
      const char sign = start + 2 < src_.size() ? src_[start + 2] : '\0';
      if (sign == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: drop spaces and tabs between the line start and a block or comment tag.
        const size_t line_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if (line_pos > 0 || line_starting) {
          bool only_blank = true;
          for (size_t i = line_pos; i < text.size(); ++i)
            if (!is_space(text[i])) only_blank = false;
          if (only_blank) text.resize(line_pos);
        }
      }
      emit_data(text);
      line_ += count_newlines(pos_, start);
      pos_ = start + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        lex_comment();
      } else if (kind == '%' && try_raw()) {
      } else {
        lex_tag(kind == '%');
      }
      line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    }
    tokens_.push_back(Token{TokenType::End, "", 0, 0, line_});
    return std::move(tokens_);
  }

 private:
  size_t find_tag_start(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i)
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    return src_.size();
  }

  int count_newlines(size_t from, size_t to) const {
    int n = 0;
    for (size_t i = from; i < to && i < src_.size(); ++i) n += src_[i] == '\n';
    return n;
  }

  void emit_data(const std::string& text) {
    if (!text.empty()) tokens_.push_back(Token{TokenType::Data, text, 0, 0, line_});
  }

  void advance_to(size_t p) {
    line_ += count_newlines(pos_, p);
    pos_ = p;
  }

  // After a closing delimiter: '-' eats all following whitespace; otherwise trim_blocks eats one
  // newline after block and comment tags unless the tag ends with '+'.
  void after_close(bool minus, bool plus, bool is_block) {
    if (minus) {
      size_t p = pos_;
      while (p < src_.size() && is_space(src_[p])) ++p;
      advance_to(p);
    } else if (is_block && !plus && pos_ < src_.size() && src_[pos_] == '\n') {
      advance_to(pos_ + 1);
    }
  }

  void lex_comment() {
    const int open_line = line_;
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos)
      fail("chat template: unterminated comment (line ", open_line, ")");
    const bool minus = end > pos_ && src_[end - 1] == '-';
    const bool plus = end > pos_ && src_[end - 1] == '+';
    advance_to(end + 2);
    after_close(minus, plus, true);
  }

  // {% raw %}...{% endraw %}: the content is text, untouched.
  bool try_raw() {
    size_t p = pos_;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    bool minus = false;
    if (p < src_.size() && src_[p] == '-') minus = true, ++p;
    if (src_.compare(p, 2, "%}") != 0) return false;
    advance_to(p + 2);
    after_close(minus, false, false);
    for (size_t s = src_.find("{%", pos_); s != std::string::npos; s = src_.find("{%", s + 2)) {
      size_t q = s + 2;
      const bool lead_minus = q < src_.size() && src_[q] == '-';
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ++q;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && is_space(src_[q])) ++q;
      bool end_minus = false, end_plus = false;
      if (q < src_.size() && src_[q] == '-')
        end_minus = true, ++q;
      else if (q < src_.size() && src_[q] == '+')
        end_plus = true, ++q;
      if (src_.compare(q, 2, "%}") != 0) continue;
      std::string text = src_.substr(pos_, s - pos_);
      if (lead_minus)
        while (!text.empty() && is_space(text.back())) text.pop_back();
      emit_data(text);
      advance_to(q + 2);
      after_close(end_minus, end_plus, true);
      return true;
    }
    fail("chat template: unterminated 'raw' block (line ", line_, ")");
  }

  void lex_tag(bool is_block) {
    const int open_line = line_;
    tokens_.push_back(
        Token{is_block ? TokenType::BlockBegin : TokenType::VarBegin, "", 0, 0, line_});
    int depth = 0;  // open brackets: a '}}' inside a dict literal does not close the tag
    const char close = is_block ? '%' : '}';
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) advance_to(pos_ + 1);
      if (pos_ >= src_.size())
        fail("chat template: unterminated '", is_block ? "{%" : "{{", "' tag opened on line ",
             open_line);
      const char c = src_[pos_];
      if (depth == 0) {
        const bool minus = c == '-' && src_.compare(pos_ + 1, 2, std::string(1, close) + "}") == 0;
        const bool plus = is_block && c == '+' && src_.compare(pos_ + 1, 2, "%}") == 0;
        if (minus || plus || (c == close && pos_ + 1 < src_.size() && src_[pos_ + 1] == '}')) {
          tokens_.push_back(
              Token{is_block ? TokenType::BlockEnd : TokenType::VarEnd, "", 0, 0, line_});
          advance_to(pos_ + 2 + ((minus || plus) ? 1 : 0));
          after_close(minus, plus, is_block);
          return;
        }
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_'))
          ++e;
        tokens_.push_back(Token{TokenType::Name, src_.substr(pos_, e - pos_), 0, 0, line_});
        advance_to(e);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number();
      } else if (c == '\'' || c == '"') {
        lex_string(c);
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                           "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                           "<",  ">",  "=",  ".",  ":",  "|",  ",", ";"};
        const char* found = nullptr;
        for (const char* op : kOps)
          if (src_.compare(pos_, std::strlen(op), op) == 0) {
            found = op;
            break;
          }
        if (!found) fail("chat template: unexpected character '", c, "' on line ", line_);
        if (*found == '(' || *found == '[' || *found == '{') ++depth;
        if ((*found == ')' || *found == ']' || *found == '}') && depth > 0) --depth;
        tokens_.push_back(Token{TokenType::Op, found, 0, 0, line_});
        advance_to(pos_ + std::strlen(found));
      }
    }
  }

  void lex_number() {
    size_t e = pos_;
    std::string digits;
    auto take_digits = [&] {
      while (e < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) {
        if (src_[e] != '_') digits += src_[e];
        ++e;
      }
    };
    take_digits();
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      is_float = true;
      digits += '.';
      ++e;
      take_digits();
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t q = e + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
        is_float = true;
        digits += 'e';
        digits.append(src_, e + 1, q - e - 1);
        e = q;
        take_digits();
      }
    }
    Token t{is_float ? TokenType::Float : TokenType::Int, digits, 0, 0, line_};
    try {
      if (is_float)
        t.real = std::stod(digits);
      else
        t.integer = std::stoll(digits);
    } catch (const std::exception&) {
      fail("chat template: number out of range: ", digits, " (line ", line_, ")");
    }
    tokens_.push_back(t);
    advance_to(e);
  }

  void lex_string(char quote) {
    const int open_line = line_;
    std::string out;
    size_t p = pos_ + 1;
    while (true) {
      if (p >= src_.size())
        fail("chat template: unterminated string literal (line ", open_line, ")");
      const char c = src_[p];
      if (c == quote) break;
      if (c != '\\' || p + 1 >= src_.size()) {
        out += c;
        ++p;
        continue;
      }
      const char n = src_[p + 1];
      p += 2;
      switch (n) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case '0':
          out += '\0';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case '\\':
        case '\'':
        case '"':
          out += n;
          break;
        case '\n':
          break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          const size_t len = n == 'x' ? 2 : n == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t i = 0; i < len; ++i, ++p) {
            if (p >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[p])))
              fail("chat template: bad \\", n, " escape in string literal (line ", line_, ")");
            cp = cp * 16 + static_cast<uint32_t>(std::stoi(std::string(1, src_[p]), nullptr, 16));
          }
          GYRE_CHECK(cp <= 0x10FFFF, "chat template: escape beyond U+10FFFF");
          tok::append_utf8(out, cp);
          break;
        }
        default:
          out += '\\';
          out += n;  // Python keeps unknown escapes as written
      }
    }
    tokens_.push_back(Token{TokenType::String, out, 0, 0, line_});
    advance_to(p + 1);
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex_template(const std::string& source) {
  // jinja2 normalises \r\n and \r to \n and drops a single trailing newline.
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src)).run();
}

}  // namespace gyre::jinja
