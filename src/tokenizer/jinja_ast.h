// Syntax tree of the Jinja engine, built by parse_template() from lexer tokens.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace gyre::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  Literal,
  Name,
  Attr,
  Item,
  Slice,
  Call,
  Filter,
  Test,
  Neg,
  Pos,
  Not,
  Binary,
  Compare,
  And,
  Or,
  Cond,
  ListLit,
  DictLit
};

struct Expr {
  ExprKind kind;
  int line = 0;
  std::string name;      // Name, Attr, Filter, Test: the identifier; Binary: the operator
  Value literal;         // Literal
  bool negated = false;  // Test: "is not"
  // Children. Call: callee, then arguments. Filter/Test: the input, then arguments. Item: object,
  // key. Slice: object, start, stop, step (null when left out). Cond: value, condition, else
  // (null when left out). Compare: the first operand, then one per operator. DictLit: key,
  // value, key, value, ...
  std::vector<ExprPtr> children;
  std::vector<std::string> kwarg_names;  // Call/Filter/Test: names of the trailing keyword args
  std::vector<std::string> compare_ops;  // Compare: "==", "in", "not in", ...
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

enum class NodeKind { Text, Output, If, For, Set, SetBlock, Macro, Break, Continue, Block };

struct Node {
  NodeKind kind;
  int line = 0;
  std::string text;                                // Text; Macro: its name
  ExprPtr expr;                                    // Output value, Set value, For iterable
  std::vector<std::pair<ExprPtr, Body>> branches;  // If: (condition or null for else, body)
  std::vector<std::string> targets;                // For/Set: target names (a, b = ...)
  std::string target_attr;                         // Set: `set ns.attr = ...` (targets[0] is ns)
  ExprPtr loop_filter;                             // For: `for x in xs if cond`
  Body body, else_body;                            // For, SetBlock, Macro, Block
  std::vector<std::pair<std::string, ExprPtr>> params;  // Macro: name and default (or null)
};

// Throws gyre::Error naming the construct and line on anything it does not support.
Body parse_template(const std::string& source);

}  // namespace gyre::jinja
