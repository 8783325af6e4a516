// Recursive-descent parser following jinja2's grammar and operator precedence:
// cond-expr < or < and < not < compare < + - < ~ < * / // % < ** < unary - + < postfix/filters.
#include <set>

#include "core/error.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_lexer.h"

namespace gyre::jinja {
namespace {

constexpr int kMaxNesting = 200;  // expression and block nesting; deeper templates are rejected

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Body parse_all() {
    std::string stopped;
    Body body = parse_body({}, stopped);
    return body;
  }

 private:
  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t n = 1) const { return toks_[std::min(pos_ + n, toks_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == TokenType::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == TokenType::Name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++pos_;
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    ++pos_;
    return true;
  }
  [[noreturn]] void error(const std::string& what) const {
    fail("chat template: ", what, " (line ", cur().line, ")");
  }
  std::string describe() const {
    switch (cur().type) {
      case TokenType::End:
        return "end of template";
      case TokenType::BlockEnd:
        return "'%}'";
      case TokenType::VarEnd:
        return "'}}'";
      case TokenType::Data:
        return "text";
      default:
        return "'" + cur().text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) error(std::string("expected '") + op + "', got " + describe());
  }
  std::string expect_name() {
    if (cur().type != TokenType::Name) error("expected a name, got " + describe());
    return toks_[pos_++].text;
  }
  void expect_block_end() {
    if (cur().type != TokenType::BlockEnd) error("expected '%}', got " + describe());
    ++pos_;
  }

  struct DepthGuard {
    explicit DepthGuard(Parser& p) : p(p) {
      if (++p.depth_ > kMaxNesting) p.error("template nested too deeply");
    }
    ~DepthGuard() { --p.depth_; }
    Parser& p;
  };

  ExprPtr make(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // Statements up to a {% name %} whose name is in `stops` (left unconsumed after the name,
  // reported in `stopped`); at top level (no stops) up to the end of the template.
  Body parse_body(const std::set<std::string>& stops, std::string& stopped) {
    DepthGuard guard(*this);
    Body body;
    const int open_line = cur().line;
    while (true) {
      const Token& t = cur();
      if (t.type == TokenType::End) {
        if (!stops.empty())
          fail("chat template: missing '{% ", *stops.begin(), " %}' for a block opened on line ",
               open_line);
        return body;
      }
      if (t.type == TokenType::Data) {
        auto n = std::make_unique<Node>();
        n->kind = NodeKind::Text;
        n->line = t.line;
        n->text = t.text;
        body.push_back(std::move(n));
        ++pos_;
      } else if (t.type == TokenType::VarBegin) {
        ++pos_;
        auto n = std::make_unique<Node>();
        n->kind = NodeKind::Output;
        n->line = t.line;
        n->expr = parse_expression();
        if (cur().type != TokenType::VarEnd) error("expected '}}', got " + describe());
        ++pos_;
        body.push_back(std::move(n));
      } else if (t.type == TokenType::BlockBegin) {
        ++pos_;
        if (cur().type != TokenType::Name) error("expected a statement name, got " + describe());
        if (stops.count(cur().text)) {
          stopped = cur().text;
          ++pos_;
          return body;
        }
        body.push_back(parse_statement());
      } else {
        error("unexpected " + describe());
      }
    }
  }

  std::unique_ptr<Node> parse_statement() {
    const int line = cur().line;
    const std::string name = expect_name();
    auto n = std::make_unique<Node>();
    n->line = line;
    std::string stopped;
    if (name == "if") {
      n->kind = NodeKind::If;
      ExprPtr cond = parse_expression();
      while (true) {
        expect_block_end();
        Body body = parse_body({"elif", "else", "endif"}, stopped);
        n->branches.emplace_back(std::move(cond), std::move(body));
        if (stopped == "endif") break;
        if (stopped == "else") {
          expect_block_end();
          n->branches.emplace_back(nullptr, parse_body({"endif"}, stopped));
          break;
        }
        cond = parse_expression();
      }
    } else if (name == "for") {
      n->kind = NodeKind::For;
      do n->targets.push_back(expect_name());
      while (skip_op(","));
      if (!skip_name("in")) error("expected 'in' in for loop, got " + describe());
      n->expr = parse_or_tuple(false);
      if (skip_name("if")) n->loop_filter = parse_or_tuple(false);
      if (is_name("recursive")) error("unsupported construct 'recursive' for loop");
      expect_block_end();
      ++loop_depth_;
      n->body = parse_body({"else", "endfor"}, stopped);
      --loop_depth_;
      if (stopped == "else") {
        expect_block_end();
        n->else_body = parse_body({"endfor"}, stopped);
      }
    } else if (name == "set") {
      n->targets.push_back(expect_name());
      if (skip_op(".")) {
        n->target_attr = expect_name();
      } else {
        while (skip_op(",")) n->targets.push_back(expect_name());
      }
      if (skip_op("=")) {
        n->kind = NodeKind::Set;
        n->expr = parse_or_tuple(true);
      } else {
        if (n->targets.size() != 1 || !n->target_attr.empty())
          error("block 'set' needs a single name");
        if (is_op("|")) error("unsupported construct 'set' block with filter");
        n->kind = NodeKind::SetBlock;
        expect_block_end();
        n->body = parse_body({"endset"}, stopped);
      }
    } else if (name == "macro") {
      n->kind = NodeKind::Macro;
      n->text = expect_name();
      expect_op("(");
      while (!skip_op(")")) {
        std::string param = expect_name();
        ExprPtr def;
        if (skip_op("=")) def = parse_expression();
        n->params.emplace_back(std::move(param), std::move(def));
        if (!is_op(")")) expect_op(",");
      }
      expect_block_end();
      const int outer_loops = loop_depth_;  // a macro body cannot break out of a caller's loop
      loop_depth_ = 0;
      n->body = parse_body({"endmacro"}, stopped);
      loop_depth_ = outer_loops;
    } else if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) error("'" + name + "' outside a for loop");
      n->kind = name == "break" ? NodeKind::Break : NodeKind::Continue;
    } else if (name == "generation") {
      // transformers' AssistantTracker tag: renders its body unchanged.
      n->kind = NodeKind::Block;
      expect_block_end();
      n->body = parse_body({"endgeneration"}, stopped);
    } else {
      fail("chat template: unsupported construct '{% ", name, " %}' (line ", line, ")");
    }
    expect_block_end();
    return n;
  }

  // An expression, or several separated by commas which make a list (Python tuple).
  ExprPtr parse_or_tuple(bool allow_cond) {
    const int line = cur().line;
    ExprPtr first = allow_cond ? parse_expression() : parse_or();
    if (!is_op(",")) return first;
    auto list = make(ExprKind::ListLit, line);
    list->name = "tuple";
    list->children.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type == TokenType::BlockEnd || is_name("if")) break;
      list->children.push_back(allow_cond ? parse_expression() : parse_or());
    }
    return list;
  }

  ExprPtr parse_expression() {
    DepthGuard guard(*this);
    ExprPtr value = parse_or();
    while (is_name("if")) {
      const int line = cur().line;
      ++pos_;
      auto cond = make(ExprKind::Cond, line);
      cond->children.push_back(std::move(value));
      cond->children.push_back(parse_or());
      cond->children.push_back(skip_name("else") ? parse_expression() : nullptr);
      value = std::move(cond);
    }
    return value;
  }

  ExprPtr binary(ExprKind kind, const std::string& op, ExprPtr l, ExprPtr r, int line) {
    auto e = make(kind, line);
    e->name = op;
    e->children.push_back(std::move(l));
    e->children.push_back(std::move(r));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr l = parse_and();
    while (is_name("or")) {
      const int line = cur().line;
      ++pos_;
      l = binary(ExprKind::Or, "or", std::move(l), parse_and(), line);
    }
    return l;
  }
  ExprPtr parse_and() {
    ExprPtr l = parse_not();
    while (is_name("and")) {
      const int line = cur().line;
      ++pos_;
      l = binary(ExprKind::And, "and", std::move(l), parse_not(), line);
    }
    return l;
  }
  ExprPtr parse_not() {
    DepthGuard guard(*this);
    if (is_name("not")) {
      auto e = make(ExprKind::Not, cur().line);
      ++pos_;
      e->children.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == TokenType::Op &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") || is_op(">="))) {
        op = cur().text;
        ++pos_;
      } else if (is_name("in")) {
        op = "in";
        ++pos_;
      } else if (is_name("not") && peek().type == TokenType::Name && peek().text == "in") {
        op = "not in";
        pos_ += 2;
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(ExprKind::Compare, line);
        cmp->children.push_back(std::move(first));
      }
      cmp->compare_ops.push_back(op);
      cmp->children.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr parse_math1() {
    ExprPtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = cur().text;
      const int line = cur().line;
      ++pos_;
      l = binary(ExprKind::Binary, op, std::move(l), parse_concat(), line);
    }
    return l;
  }
  ExprPtr parse_concat() {
    ExprPtr l = parse_math2();
    while (is_op("~")) {
      const int line = cur().line;
      ++pos_;
      l = binary(ExprKind::Binary, "~", std::move(l), parse_math2(), line);
    }
    return l;
  }
  ExprPtr parse_math2() {
    ExprPtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().text;
      const int line = cur().line;
      ++pos_;
      l = binary(ExprKind::Binary, op, std::move(l), parse_pow(), line);
    }
    return l;
  }
  ExprPtr parse_pow() {
    ExprPtr l = parse_unary(true);
    while (is_op("**")) {
      const int line = cur().line;
      ++pos_;
      l = binary(ExprKind::Binary, "**", std::move(l), parse_unary(true), line);
    }
    return l;
  }
  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = make(is_op("-") ? ExprKind::Neg : ExprKind::Pos, cur().line);
      ++pos_;
      e->children.push_back(parse_unary(false));
    } else {
      e = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filters(std::move(e)) : std::move(e);
  }

  ExprPtr parse_primary() {
    DepthGuard guard(*this);
    const Token& t = cur();
    const int line = t.line;
    if (t.type == TokenType::Name) {
      ++pos_;
      if (t.text == "true" || t.text == "True") return literal(Value::from_bool(true), line);
      if (t.text == "false" || t.text == "False") return literal(Value::from_bool(false), line);
      if (t.text == "none" || t.text == "None") return literal(Value::none(), line);
      auto e = make(ExprKind::Name, line);
      e->name = t.text;
      return e;
    }
    if (t.type == TokenType::String) {
      std::string s;
      while (cur().type == TokenType::String) s += toks_[pos_++].text;  // adjacent literals join
      return literal(Value::from_string(std::move(s)), line);
    }
    if (t.type == TokenType::Int) {
      ++pos_;
      return literal(Value::from_int(t.integer), line);
    }
    if (t.type == TokenType::Float) {
      ++pos_;
      return literal(Value::from_float(t.real), line);
    }
    if (skip_op("(")) {
      if (skip_op(")")) {
        auto empty = make(ExprKind::ListLit, line);
        empty->name = "tuple";
        return empty;
      }
      ExprPtr inner = parse_or_tuple(true);
      expect_op(")");
      return inner;
    }
    if (skip_op("[")) {
      auto list = make(ExprKind::ListLit, line);
      while (!skip_op("]")) {
        list->children.push_back(parse_expression());
        if (!is_op("]")) expect_op(",");
      }
      return list;
    }
    if (skip_op("{")) {
      auto dict = make(ExprKind::DictLit, line);
      while (!skip_op("}")) {
        dict->children.push_back(parse_expression());
        expect_op(":");
        dict->children.push_back(parse_expression());
        if (!is_op("}")) expect_op(",");
      }
      return dict;
    }
    error("unexpected " + describe() + " in expression");
  }

  ExprPtr literal(Value v, int line) {
    auto e = make(ExprKind::Literal, line);
    e->literal = std::move(v);
    return e;
  }

  void parse_call_args(Expr& e) {
    // After '(': positional arguments, then name=value keyword arguments.
    while (!skip_op(")")) {
      if (cur().type == TokenType::Name && peek().type == TokenType::Op && peek().text == "=") {
        e.kwarg_names.push_back(cur().text);
        pos_ += 2;
        e.children.push_back(parse_expression());
      } else {
        if (!e.kwarg_names.empty()) error("positional argument after keyword argument");
        e.children.push_back(parse_expression());
      }
      if (!is_op(")")) expect_op(",");
    }
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      DepthGuard guard(*this);
      const int line = cur().line;
      if (skip_op(".")) {
        auto a = make(ExprKind::Attr, line);
        if (cur().type == TokenType::Int) {  // foo.0 is foo[0]
          a->kind = ExprKind::Item;
          a->children.push_back(std::move(e));
          a->children.push_back(literal(Value::from_int(toks_[pos_++].integer), line));
        } else {
          a->name = expect_name();
          a->children.push_back(std::move(e));
        }
        e = std::move(a);
      } else if (skip_op("[")) {
        ExprPtr parts[3];
        bool is_slice = false;
        for (int i = 0; i < 3; ++i) {
          if (!is_op(":") && !is_op("]")) parts[i] = parse_expression();
          if (i < 2 && skip_op(":")) {
            is_slice = true;
            continue;
          }
          break;
        }
        expect_op("]");
        auto s = make(is_slice ? ExprKind::Slice : ExprKind::Item, line);
        s->children.push_back(std::move(e));
        if (!is_slice && !parts[0]) error("empty subscript");
        for (int i = 0; i < (is_slice ? 3 : 1); ++i) s->children.push_back(std::move(parts[i]));
        e = std::move(s);
      } else if (skip_op("(")) {
        auto c = make(ExprKind::Call, line);
        c->children.push_back(std::move(e));
        parse_call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_filters(ExprPtr e) {
    while (true) {
      DepthGuard guard(*this);
      const int line = cur().line;
      if (skip_op("|")) {
        auto f = make(ExprKind::Filter, line);
        f->name = expect_name();
        while (skip_op(".")) f->name += "." + expect_name();
        f->children.push_back(std::move(e));
        if (skip_op("(")) parse_call_args(*f);
        e = parse_postfix(std::move(f));
      } else if (skip_name("is")) {
        auto t = make(ExprKind::Test, line);
        t->negated = skip_name("not");
        t->name = expect_name();
        t->children.push_back(std::move(e));
        if (skip_op("(")) {
          parse_call_args(*t);
        } else if ((cur().type == TokenType::Name || cur().type == TokenType::String ||
                    cur().type == TokenType::Int || cur().type == TokenType::Float || is_op("(") ||
                    is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          t->children.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;  // enclosing for loops, for break/continue
};

}  // namespace

Body parse_template(const std::string& source) {
  return Parser(lex_template(source)).parse_all();
}

}  // namespace gyre::jinja
