// Lexer of the Jinja engine: splits a template into text and tag tokens the way jinja2's lexer
// does with trim_blocks=True and lstrip_blocks=True (the settings transformers uses for chat
// templates), including '-' / '+' whitespace control, comments, {% raw %}, newline
// normalisation and the removal of one trailing newline (keep_trailing_newline=False).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace gyre::jinja {

enum class TokenType {
  Data,
  BlockBegin,
  BlockEnd,
  VarBegin,
  VarEnd,
  Name,
  String,
  Int,
  Float,
  Op,
  End
};

struct Token {
  TokenType type;
  std::string text;  // data, name, operator, or the decoded string literal
  int64_t integer = 0;
  double real = 0;
  int line = 1;
};

std::vector<Token> lex_template(const std::string& source);

}  // namespace gyre::jinja
