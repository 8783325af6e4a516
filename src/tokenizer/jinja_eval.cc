#include "tokenizer/jinja_eval.h"

#include <cmath>
#include <map>

#include "core/error.h"
#include "tokenizer/jinja_builtins.h"

namespace gyre::jinja {
namespace {

constexpr int kMaxDepth = 200;          // evaluation recursion (macro calls, nesting)
constexpr int64_t kMaxSteps = 100'000;  // loop iterations + macro calls per render
constexpr size_t kMaxOutputBytes = 8u << 20;

using Frame = std::map<std::string, Value>;
using Scope = std::vector<std::shared_ptr<Frame>>;

enum class Flow { Normal, Break, Continue };

class Evaluator {
 public:
  explicit Evaluator(Scope scope) : scope_(std::move(scope)) {}

  void exec_body(const Body& body, std::string& out, Flow& flow) {
    for (const auto& node : body) {
      exec(*node, out, flow);
      if (flow != Flow::Normal) return;
    }
  }

 private:
  struct DepthGuard {
    DepthGuard(Evaluator& e, int line) : e(e) {
      if (++e.depth_ > kMaxDepth) fail("chat template: recursion too deep (line ", line, ")");
    }
    ~DepthGuard() { --e.depth_; }
    Evaluator& e;
  };

  void step(int line) {
    if (++steps_ > kMaxSteps)
      fail("chat template: too many loop iterations or calls (line ", line, ")");
  }

  void append(std::string& out, const std::string& s, int line) {
    if (out.size() + s.size() > kMaxOutputBytes)
      fail("chat template: output larger than ", kMaxOutputBytes, " bytes (line ", line, ")");
    out += s;
  }

  Value lookup(const std::string& name) const {
    for (auto it = scope_.rbegin(); it != scope_.rend(); ++it) {
      auto found = (*it)->find(name);
      if (found != (*it)->end()) return found->second;
    }
    return Value::undefined(name);
  }

  void assign(const std::string& name, Value v) { (*scope_.back())[name] = std::move(v); }

  void exec(const Node& n, std::string& out, Flow& flow) {
    DepthGuard guard(*this, n.line);
    switch (n.kind) {
      case NodeKind::Text:
        append(out, n.text, n.line);
        return;
      case NodeKind::Output:
        append(out, to_str(eval(*n.expr)), n.line);
        return;
      case NodeKind::If:
        for (const auto& [cond, body] : n.branches)
          if (!cond || truthy(eval(*cond))) {
            exec_body(body, out, flow);
            return;
          }
        return;
      case NodeKind::For:
        exec_for(n, out);
        return;
      case NodeKind::Set: {
        Value v = eval(*n.expr);
        if (!n.target_attr.empty()) {
          Value ns = lookup(n.targets[0]);
          if (!ns.is_dict() || !ns.dict->is_namespace)
            fail("chat template: can only set attributes of a namespace() object (line ", n.line,
                 ")");
          ns.dict->set(n.target_attr, std::move(v));
        } else if (n.targets.size() == 1) {
          assign(n.targets[0], std::move(v));
        } else {
          unpack(n.targets, v, n.line);
        }
        return;
      }
      case NodeKind::SetBlock: {
        std::string captured;
        Flow inner = Flow::Normal;
        exec_body(n.body, captured, inner);
        assign(n.targets[0], Value::from_string(std::move(captured)));
        return;
      }
      case NodeKind::Macro:
        assign(n.text, make_macro(n));
        return;
      case NodeKind::Break:
        flow = Flow::Break;
        return;
      case NodeKind::Continue:
        flow = Flow::Continue;
        return;
      case NodeKind::Block:
        exec_body(n.body, out, flow);
        return;
    }
  }

  void unpack(const std::vector<std::string>& names, const Value& v, int line) {
    List items = iterate(v);
    if (items.size() != names.size())
      fail("chat template: cannot unpack ", items.size(), " values into ", names.size(),
           " names (line ", line, ")");
    for (size_t i = 0; i < names.size(); ++i) assign(names[i], items[i]);
  }

  void exec_for(const Node& n, std::string& out) {
    const Value seq = eval(*n.expr);
    List items = iterate(seq);
    if (n.loop_filter) {
      List kept;
      for (auto& item : items) {
        step(n.line);
        scope_.push_back(std::make_shared<Frame>());
        bind_targets(n, item);
        const bool keep = truthy(eval(*n.loop_filter));
        scope_.pop_back();
        if (keep) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      Flow flow = Flow::Normal;
      exec_body(n.else_body, out, flow);
      return;
    }
    const int64_t count = static_cast<int64_t>(items.size());
    auto position = std::make_shared<int64_t>(0);  // read by loop.cycle()
    const Value cycle = Value::function("loop.cycle", [position](List& args, Kwargs&) {
      if (args.empty()) fail("chat template: loop.cycle() needs at least one argument");
      return args[static_cast<size_t>(*position) % args.size()];
    });
    for (int64_t i = 0; i < count; ++i) {
      step(n.line);
      *position = i;
      scope_.push_back(std::make_shared<Frame>());
      bind_targets(n, items[i]);
      Value loop = Value::new_dict();
      auto& d = loop.dict->entries;  // keys are distinct, so no lookups are needed
      d.reserve(13);
      d.emplace_back("index", Value::from_int(i + 1));
      d.emplace_back("index0", Value::from_int(i));
      d.emplace_back("revindex", Value::from_int(count - i));
      d.emplace_back("revindex0", Value::from_int(count - i - 1));
      d.emplace_back("first", Value::from_bool(i == 0));
      d.emplace_back("last", Value::from_bool(i == count - 1));
      d.emplace_back("length", Value::from_int(count));
      d.emplace_back("depth", Value::from_int(1));
      d.emplace_back("depth0", Value::from_int(0));
      d.emplace_back("cycle", cycle);
      if (i > 0) d.emplace_back("previtem", items[i - 1]);
      if (i + 1 < count) d.emplace_back("nextitem", items[i + 1]);
      assign("loop", loop);
      Flow flow = Flow::Normal;
      exec_body(n.body, out, flow);
      scope_.pop_back();
      if (flow == Flow::Break) break;
    }
  }

  void bind_targets(const Node& n, const Value& item) {
    if (n.targets.size() == 1)
      assign(n.targets[0], item);
    else
      unpack(n.targets, item, n.line);
  }

  Value make_macro(const Node& n) {
    const Node* def = &n;
    // Weak references: the macro lives in one of these frames, and a strong reference would
    // make a cycle that is never freed.
    std::vector<std::weak_ptr<Frame>> closure(scope_.begin(), scope_.end());
    return Value::function(n.text, [this, def, closure](List& args, Kwargs& kwargs) {
      step(def->line);
      Scope frames;
      for (const auto& weak : closure) {
        frames.push_back(weak.lock());
        if (!frames.back())
          fail("chat template: macro '", def->text, "' called outside the scope it was defined in");
      }
      if (args.size() > def->params.size())
        fail("chat template: macro '", def->text, "' takes ", def->params.size(),
             " arguments, got ", args.size(), " (line ", def->line, ")");
      Scope saved = std::move(scope_);
      scope_ = std::move(frames);
      scope_.push_back(std::make_shared<Frame>());
      std::string out;
      try {
        for (size_t i = 0; i < def->params.size(); ++i) {
          const auto& [pname, pdefault] = def->params[i];
          Value v = Value::undefined(pname);
          if (i < args.size()) v = args[i];
          bool from_kw = false;
          for (auto& [k, kv] : kwargs)
            if (k == pname) v = kv, from_kw = true;
          if (i >= args.size() && !from_kw && pdefault) v = eval(*pdefault);
          assign(pname, std::move(v));
        }
        for (auto& [k, kv] : kwargs) {
          bool known = false;
          for (const auto& p : def->params) known = known || p.first == k;
          if (!known)
            fail("chat template: macro '", def->text, "' has no parameter '", k, "' (line ",
                 def->line, ")");
        }
        Flow flow = Flow::Normal;
        exec_body(def->body, out, flow);
      } catch (...) {
        scope_ = std::move(saved);
        throw;
      }
      scope_ = std::move(saved);
      return Value::from_string(std::move(out));
    });
  }

  Value eval(const Expr& e) {
    DepthGuard guard(*this, e.line);
    try {
      return eval_inner(e);
    } catch (const Error& err) {
      const std::string msg = err.what();
      if (msg.find("(line ") != std::string::npos || msg.rfind("chat template: ", 0) != 0) throw;
      throw Error(msg + " (line " + std::to_string(e.line) + ")");
    }
  }

  Value eval_inner(const Expr& e) {
    switch (e.kind) {
      case ExprKind::Literal:
        return e.literal;
      case ExprKind::Name:
        return lookup(e.name);
      case ExprKind::Attr:
        return get_attr(eval(*e.children[0]), e.name);
      case ExprKind::Item:
        return get_item(eval(*e.children[0]), eval(*e.children[1]));
      case ExprKind::Slice: {
        Value obj = eval(*e.children[0]);
        Value bounds[3];
        const Value* ptrs[3] = {nullptr, nullptr, nullptr};
        for (int i = 0; i < 3; ++i)
          if (e.children[1 + i]) {
            bounds[i] = eval(*e.children[1 + i]);
            ptrs[i] = &bounds[i];
          }
        return get_slice(obj, ptrs[0], ptrs[1], ptrs[2]);
      }
      case ExprKind::Call: {
        Value callee = eval(*e.children[0]);
        if (callee.is_undefined()) fail_undefined(callee);
        if (callee.kind != Kind::Callable)
          fail("chat template: '", type_name(callee), "' object is not callable");
        auto [args, kwargs] = eval_args(e, 1);
        return callee.fn->call(args, kwargs);
      }
      case ExprKind::Filter: {
        Value input = eval(*e.children[0]);
        auto [args, kwargs] = eval_args(e, 1);
        return apply_filter(e.name, input, args, kwargs);
      }
      case ExprKind::Test: {
        Value input = eval(*e.children[0]);
        auto [args, kwargs] = eval_args(e, 1);
        if (!kwargs.empty()) fail("chat template: tests take no keyword arguments");
        return Value::from_bool(apply_test(e.name, input, args) != e.negated);
      }
      case ExprKind::Neg:
      case ExprKind::Pos: {
        Value v = eval(*e.children[0]);
        if (v.is_undefined()) fail_undefined(v);
        if (!v.is_number())
          fail("chat template: bad operand type for unary ", e.kind == ExprKind::Neg ? "-" : "+",
               ": '", type_name(v), "'");
        if (e.kind == ExprKind::Pos) return v.kind == Kind::Bool ? Value::from_int(v.boolean) : v;
        if (v.kind == Kind::Float) return Value::from_float(-v.real);
        const int64_t i = v.kind == Kind::Bool ? v.boolean : v.integer;
        if (i == INT64_MIN) fail("chat template: integer overflow");
        return Value::from_int(-i);
      }
      case ExprKind::Not:
        return Value::from_bool(!truthy(eval(*e.children[0])));
      case ExprKind::And: {
        Value l = eval(*e.children[0]);
        return truthy(l) ? eval(*e.children[1]) : l;
      }
      case ExprKind::Or: {
        Value l = eval(*e.children[0]);
        return truthy(l) ? l : eval(*e.children[1]);
      }
      case ExprKind::Cond:
        if (truthy(eval(*e.children[1]))) return eval(*e.children[0]);
        return e.children[2] ? eval(*e.children[2]) : Value::undefined();
      case ExprKind::Binary:
        return binary_op(e.name, eval(*e.children[0]), eval(*e.children[1]));
      case ExprKind::Compare: {
        Value left = eval(*e.children[0]);
        for (size_t i = 0; i < e.compare_ops.size(); ++i) {
          Value right = eval(*e.children[i + 1]);
          if (!compare(e.compare_ops[i], left, right)) return Value::from_bool(false);
          left = std::move(right);
        }
        return Value::from_bool(true);
      }
      case ExprKind::ListLit: {
        List items;
        for (const auto& c : e.children) items.push_back(eval(*c));
        return e.name == "tuple" ? Value::tuple(std::move(items))
                                 : Value::from_list(std::move(items));
      }
      case ExprKind::DictLit: {
        Value d = Value::new_dict();
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          Value k = eval(*e.children[i]);
          if (!k.is_string()) fail("chat template: only string dict keys are supported");
          d.dict->set(k.str, eval(*e.children[i + 1]));
        }
        return d;
      }
    }
    fail("chat template: unknown expression");
  }

  std::pair<List, Kwargs> eval_args(const Expr& e, size_t first) {
    List args;
    Kwargs kwargs;
    const size_t n_kw = e.kwarg_names.size();
    const size_t n_pos = e.children.size() - first - n_kw;
    for (size_t i = 0; i < n_pos; ++i) args.push_back(eval(*e.children[first + i]));
    for (size_t i = 0; i < n_kw; ++i)
      kwargs.emplace_back(e.kwarg_names[i], eval(*e.children[first + n_pos + i]));
    return {std::move(args), std::move(kwargs)};
  }

  static bool contains(const Value& container, const Value& item) {
    switch (container.kind) {
      case Kind::Undefined:
        return false;
      case Kind::String:
        if (!item.is_string())
          fail("chat template: 'in <string>' requires string as left operand, not ",
               type_name(item));
        return container.str.find(item.str) != std::string::npos;
      case Kind::List:
        for (const auto& x : *container.list)
          if (equals(x, item)) return true;
        return false;
      case Kind::Dict:
        return item.is_string() && container.dict->find(item.str) != nullptr;
      default:
        fail("chat template: argument of type '", type_name(container), "' is not iterable");
    }
  }

  static bool compare(const std::string& op, const Value& l, const Value& r) {
    if (op == "==") return equals(l, r);
    if (op == "!=") return !equals(l, r);
    if (op == "in") return contains(r, l);
    if (op == "not in") return !contains(r, l);
    if (l.is_undefined()) fail_undefined(l);
    if (r.is_undefined()) fail_undefined(r);
    if (op == "<") return less_than(l, r);
    if (op == ">") return less_than(r, l);
    if (op == "<=") return !less_than(r, l);
    return !less_than(l, r);  // >=
  }

  static int64_t as_int(const Value& v) { return v.kind == Kind::Bool ? v.boolean : v.integer; }

  static Value binary_op(const std::string& op, const Value& l, const Value& r) {
    if (op == "~") {
      std::string s = to_str(l) + to_str(r);
      if (s.size() > kMaxStringBytes) fail("chat template: string too long");
      return Value::from_string(std::move(s));
    }
    if (l.is_undefined()) fail_undefined(l);
    if (r.is_undefined()) fail_undefined(r);
    const bool both_int = (l.kind == Kind::Int || l.kind == Kind::Bool) &&
                          (r.kind == Kind::Int || r.kind == Kind::Bool);
    if (l.is_number() && r.is_number()) {
      const double x = l.as_double(), y = r.as_double();
      int64_t out = 0;
      if (op == "+") {
        if (!both_int) return Value::from_float(x + y);
        if (__builtin_add_overflow(as_int(l), as_int(r), &out))
          fail("chat template: integer overflow");
        return Value::from_int(out);
      }
      if (op == "-") {
        if (!both_int) return Value::from_float(x - y);
        if (__builtin_sub_overflow(as_int(l), as_int(r), &out))
          fail("chat template: integer overflow");
        return Value::from_int(out);
      }
      if (op == "*") {
        if (!both_int) return Value::from_float(x * y);
        if (__builtin_mul_overflow(as_int(l), as_int(r), &out))
          fail("chat template: integer overflow");
        return Value::from_int(out);
      }
      if (y == 0 && (op == "/" || op == "//" || op == "%")) fail("chat template: division by zero");
      if (op == "/") return Value::from_float(x / y);
      if (op == "//" || op == "%") {
        if (both_int) {
          const int64_t a = as_int(l), b = as_int(r);
          if (a == INT64_MIN && b == -1) fail("chat template: integer overflow");
          int64_t q = a / b, m = a % b;
          if (m != 0 && ((m < 0) != (b < 0))) --q, m += b;  // Python floors
          return Value::from_int(op == "//" ? q : m);
        }
        const double q = std::floor(x / y);
        return Value::from_float(op == "//" ? q : x - q * y);
      }
      if (op == "**") {
        if (both_int && as_int(r) >= 0) {
          const int64_t base = as_int(l), exponent = as_int(r);
          if (base == 0 || base == 1) return Value::from_int(exponent == 0 ? 1 : base);
          if (base == -1) return Value::from_int(exponent % 2 ? -1 : 1);
          int64_t result = 1;  // |base| >= 2 overflows within 64 steps
          for (int64_t k = 0; k < exponent; ++k)
            if (__builtin_mul_overflow(result, base, &result))
              fail("chat template: integer overflow");
          return Value::from_int(result);
        }
        return Value::from_float(std::pow(x, y));
      }
    }
    if (op == "+" && l.is_string() && r.is_string()) {
      if (l.str.size() + r.str.size() > kMaxStringBytes) fail("chat template: string too long");
      return Value::from_string(l.str + r.str);
    }
    if (op == "+" && l.is_list() && r.is_list()) {
      if (l.list->size() + r.list->size() > kMaxListItems) fail("chat template: list too long");
      List items = *l.list;
      items.insert(items.end(), r.list->begin(), r.list->end());
      return Value::from_list(std::move(items));
    }
    if (op == "*" && (l.is_string() || l.is_list()) &&
        (r.kind == Kind::Int || r.kind == Kind::Bool))
      return repeat(l, as_int(r));
    if (op == "*" && (r.is_string() || r.is_list()) &&
        (l.kind == Kind::Int || l.kind == Kind::Bool))
      return repeat(r, as_int(l));
    fail("chat template: unsupported operand type(s) for ", op, ": '", type_name(l), "' and '",
         type_name(r), "'");
  }

  static Value repeat(const Value& v, int64_t times) {
    if (times <= 0) return v.is_string() ? Value::from_string("") : Value::from_list();
    const size_t unit = v.is_string() ? v.str.size() : v.list->size();
    const size_t cap = v.is_string() ? kMaxStringBytes : kMaxListItems;
    if (unit != 0 && static_cast<uint64_t>(times) > cap / unit)
      fail("chat template: repetition too large");
    if (v.is_string()) {
      std::string s;
      for (int64_t i = 0; i < times; ++i) s += v.str;
      return Value::from_string(std::move(s));
    }
    List items;
    for (int64_t i = 0; i < times; ++i) items.insert(items.end(), v.list->begin(), v.list->end());
    return Value::from_list(std::move(items));
  }

  Scope scope_;
  int depth_ = 0;
  int64_t steps_ = 0;
};

}  // namespace

std::string render(const Body& body, const Value& variables) {
  auto globals = std::make_shared<Frame>();
  const Value builtins = make_globals();
  for (const auto& [k, v] : builtins.dict->entries) (*globals)[k] = v;
  auto top = std::make_shared<Frame>();
  if (variables.is_dict())
    for (auto& [k, v] : variables.dict->entries) (*top)[k] = v;
  Evaluator ev(Scope{globals, top});
  std::string out;
  Flow flow = Flow::Normal;
  ev.exec_body(body, out, flow);
  return out;
}

}  // namespace gyre::jinja
