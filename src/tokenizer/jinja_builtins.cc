// jinja2's filters and tests (plus transformers' tojson), on plain Values.
#include "tokenizer/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "tokenizer/jinja_strings.h"

namespace gyre::jinja {
namespace {

// Positional argument `i`, or keyword `name`, or `fallback`.
Value param(List& args, Kwargs& kwargs, size_t i, const char* name, Value fallback) {
  for (auto& [k, v] : kwargs)
    if (k == name) return v;
  return i < args.size() ? args[i] : fallback;
}

// jinja2's attribute getter: "a.b.0" walks dict keys and list indices.
Value attribute_of(const Value& item, const std::string& path) {
  Value cur = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    if (cur.is_undefined()) return cur;
    cur = numeric ? get_item(cur, Value::from_int(std::stoll(part)))
                  : get_item(cur, Value::from_string(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

// Sort key comparison for sort/unique/min/max: strings compare case-insensitively by default.
Value sort_key(const Value& v, bool case_sensitive) {
  return (v.is_string() && !case_sensitive) ? Value::from_string(ascii_lower(v.str)) : v;
}

double round_python(double x, int64_t precision, const std::string& method) {
  if (method == "common") {
    // printf rounds the exact binary value, half to even, as Python's round() does.
    if (precision < 0 || precision > 300) fail("chat template: round(): unsupported precision");
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), x);
    return std::strtod(buf, nullptr);
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  if (method == "ceil") return std::ceil(x * scale) / scale;
  if (method == "floor") return std::floor(x * scale) / scale;
  fail("chat template: round(): method must be 'common', 'ceil' or 'floor'");
}

std::string indent(const std::string& s, const std::string& pad, bool first, bool blank) {
  std::vector<std::string> lines = split_lines(s + "\n");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n";
    const bool add = (i > 0 || first) && (blank || !lines[i].empty());
    out += (add ? pad : "") + lines[i];
  }
  if (first && lines.size() == 1 && lines[0].empty() && !blank) out = pad + out;
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// "%s %d %r %%" printf-style formatting of Python's str % args.
std::string percent_format(const std::string& fmt, List& args) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) fail("chat template: format(): incomplete format");
    const char c = fmt[i];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (next >= args.size()) fail("chat template: format(): not enough arguments");
    const Value& v = args[next++];
    if (c == 's')
      out += to_str(v);
    else if (c == 'r')
      out += repr(v);
    else if ((c == 'd' || c == 'i') && v.is_number())
      out += std::to_string(static_cast<int64_t>(v.as_double()));
    else
      fail("chat template: unsupported construct: format conversion '%", c, "'");
  }
  return out;
}

List select_items(const Value& input, List& args, bool by_attr, bool keep_if) {
  List out;
  size_t pos = 0;
  std::string attr;
  if (by_attr) {
    if (args.empty() || !args[0].is_string())
      fail("chat template: selectattr/rejectattr need an attribute name");
    attr = args[0].str;
    pos = 1;
  }
  std::string test;
  if (pos < args.size()) test = to_str(args[pos++]);
  List test_args(args.begin() + static_cast<std::ptrdiff_t>(std::min(pos, args.size())),
                 args.end());
  for (const auto& item : iterate(input)) {
    const Value subject = by_attr ? attribute_of(item, attr) : item;
    const bool ok = test.empty() ? truthy(subject) : apply_test(test, subject, test_args);
    if (ok == keep_if) out.push_back(item);
  }
  return out;
}

}  // namespace

Value apply_filter(const std::string& name, const Value& input, List& args, Kwargs& kwargs) {
  if (name == "default" || name == "d") {
    const bool boolean = truthy(param(args, kwargs, 1, "boolean", Value::from_bool(false)));
    const bool use_default = input.is_undefined() || (boolean && !truthy(input));
    return use_default ? param(args, kwargs, 0, "default_value", Value::from_string("")) : input;
  }
  if (name == "safe") return input;
  if (name == "length" || name == "count") return Value::from_int(length(input));
  if (name == "string") return input.is_string() ? input : Value::from_string(to_str(input));
  if (name == "trim") {
    const Value chars = param(args, kwargs, 0, "chars", Value::none());
    return Value::from_string(
        strip_chars(to_str(input), chars.is_none() ? kWhitespace : to_str(chars), true, true));
  }
  if (name == "lower") return Value::from_string(ascii_lower(to_str(input)));
  if (name == "upper") return Value::from_string(ascii_upper(to_str(input)));
  if (name == "title") return Value::from_string(jinja_title(to_str(input)));
  if (name == "capitalize") return Value::from_string(capitalize(to_str(input)));
  if (name == "escape" || name == "e") return Value::from_string(html_escape(to_str(input)));
  if (name == "tojson") {
    const Value ind = param(args, kwargs, 1, "indent", Value::none());
    if (truthy(param(args, kwargs, 0, "ensure_ascii", Value::from_bool(false))))
      fail("chat template: unsupported construct: tojson(ensure_ascii=True)");
    if (!param(args, kwargs, 2, "separators", Value::none()).is_none())
      fail("chat template: unsupported construct: tojson(separators=...)");
    const bool sort_keys = truthy(param(args, kwargs, 3, "sort_keys", Value::from_bool(false)));
    if (input.is_undefined())
      fail("chat template: tojson: object of type Undefined is not JSON serializable");
    return Value::from_string(to_json(
        input, ind.is_none() ? -1 : static_cast<int>(std::clamp<int64_t>(ind.integer, 0, 64)),
        sort_keys));
  }
  if (name == "join") {
    const Value sep = param(args, kwargs, 0, "d", Value::from_string(""));
    const Value attr = param(args, kwargs, 1, "attribute", Value::none());
    std::string out;
    bool first = true;
    for (const auto& item : iterate(input)) {
      out += (first ? "" : to_str(sep)) +
             to_str(attr.is_none() ? item : attribute_of(item, to_str(attr)));
      if (out.size() > kMaxStringBytes) fail("chat template: string too long");
      first = false;
    }
    return Value::from_string(std::move(out));
  }
  if (name == "first" || name == "last") {
    const List items = iterate(input);
    if (items.empty()) return Value::undefined();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::from_list(iterate(input));
  if (name == "items") {
    if (input.is_undefined()) return Value::from_list();
    if (!input.is_dict())
      fail("chat template: items filter needs a mapping, got ", type_name(input));
    List out;
    for (const auto& [k, v] : input.dict->entries)
      out.push_back(Value::tuple({Value::from_string(k), v}));
    return Value::from_list(std::move(out));
  }
  if (name == "dictsort") {
    Value pairs = apply_filter("items", input, args, kwargs);
    std::stable_sort(pairs.list->begin(), pairs.list->end(), [](const Value& a, const Value& b) {
      return less_than(sort_key((*a.list)[0], false), sort_key((*b.list)[0], false));
    });
    return pairs;
  }
  if (name == "replace") {
    const Value count = param(args, kwargs, 2, "count", Value::none());
    if (args.size() < 2) fail("chat template: replace filter needs two arguments");
    return Value::from_string(replace_all(to_str(input), to_str(args[0]), to_str(args[1]),
                                          count.is_none() ? -1 : count.integer));
  }
  if (name == "select" || name == "reject")
    return Value::from_list(select_items(input, args, false, name == "select"));
  if (name == "selectattr" || name == "rejectattr")
    return Value::from_list(select_items(input, args, true, name == "selectattr"));
  if (name == "map") {
    List out;
    const Value attr = param(args, kwargs, 99, "attribute", Value::none());
    for (const auto& item : iterate(input)) {
      if (!attr.is_none()) {
        Value v = attribute_of(item, to_str(attr));
        out.push_back(v.is_undefined() ? param(args, kwargs, 99, "default", v) : v);
      } else {
        if (args.empty()) fail("chat template: map needs a filter name or attribute=");
        List rest(args.begin() + 1, args.end());
        Kwargs none;
        out.push_back(apply_filter(to_str(args[0]), item, rest, none));
      }
    }
    return Value::from_list(std::move(out));
  }
  if (name == "int") {
    const Value fallback = param(args, kwargs, 0, "default", Value::from_int(0));
    if (input.kind == Kind::Int) return input;
    if (input.kind == Kind::Bool) return Value::from_int(input.boolean);
    if (input.kind == Kind::Float)
      return std::isfinite(input.real) ? Value::from_int(static_cast<int64_t>(input.real))
                                       : fallback;
    if (input.is_string()) {
      const std::string s = strip_chars(input.str, kWhitespace, true, true);
      char* end = nullptr;
      const long long i = std::strtoll(s.c_str(), &end, 10);
      if (!s.empty() && end && *end == '\0') return Value::from_int(i);
      const double f = std::strtod(s.c_str(), &end);
      if (!s.empty() && end && *end == '\0' && std::isfinite(f))
        return Value::from_int(static_cast<int64_t>(f));
    }
    return fallback;
  }
  if (name == "float") {
    const Value fallback = param(args, kwargs, 0, "default", Value::from_float(0.0));
    if (input.is_number()) return Value::from_float(input.as_double());
    if (input.is_string()) {
      const std::string s = strip_chars(input.str, kWhitespace, true, true);
      char* end = nullptr;
      const double f = std::strtod(s.c_str(), &end);
      if (!s.empty() && end && *end == '\0') return Value::from_float(f);
    }
    return fallback;
  }
  if (name == "abs") {
    if (input.kind == Kind::Float) return Value::from_float(std::fabs(input.real));
    if (input.kind == Kind::Int && input.integer != INT64_MIN)
      return Value::from_int(std::llabs(input.integer));
    if (input.kind == Kind::Bool) return Value::from_int(input.boolean);
    fail("chat template: bad operand type for abs(): '", type_name(input), "'");
  }
  if (name == "round") {
    if (!input.is_number()) fail("chat template: round filter needs a number");
    const int64_t precision = param(args, kwargs, 0, "precision", Value::from_int(0)).integer;
    const std::string method =
        to_str(param(args, kwargs, 1, "method", Value::from_string("common")));
    return Value::from_float(round_python(input.as_double(), precision, method));
  }
  if (name == "indent") {
    const Value width = param(args, kwargs, 0, "width", Value::from_int(4));
    const std::string pad =
        width.is_string()
            ? width.str
            : std::string(static_cast<size_t>(std::clamp<int64_t>(width.integer, 0, 256)), ' ');
    return Value::from_string(
        indent(to_str(input), pad, truthy(param(args, kwargs, 1, "first", Value::from_bool(false))),
               truthy(param(args, kwargs, 2, "blank", Value::from_bool(false)))));
  }
  if (name == "reverse") {
    if (input.is_string())
      return get_slice(input, nullptr, nullptr, &args.emplace_back(Value::from_int(-1)));
    List items = iterate(input);
    std::reverse(items.begin(), items.end());
    return Value::from_list(std::move(items));
  }
  if (name == "sort" || name == "unique" || name == "min" || name == "max") {
    const bool case_sensitive = truthy(
        param(args, kwargs, name == "sort" ? 1 : 0, "case_sensitive", Value::from_bool(false)));
    const Value attr = param(args, kwargs, name == "sort" ? 2 : 1, "attribute", Value::none());
    auto key = [&](const Value& v) {
      return sort_key(attr.is_none() ? v : attribute_of(v, to_str(attr)), case_sensitive);
    };
    List items = iterate(input);
    if (name == "unique") {
      List out;
      for (const auto& item : items)
        if (std::none_of(out.begin(), out.end(),
                         [&](const Value& o) { return equals(key(o), key(item)); }))
          out.push_back(item);
      return Value::from_list(std::move(out));
    }
    std::stable_sort(items.begin(), items.end(),
                     [&](const Value& a, const Value& b) { return less_than(key(a), key(b)); });
    if (name == "sort") {
      if (truthy(param(args, kwargs, 0, "reverse", Value::from_bool(false))))
        std::reverse(items.begin(), items.end());
      return Value::from_list(std::move(items));
    }
    if (items.empty()) return Value::undefined();
    return name == "min" ? items.front() : items.back();
  }
  if (name == "sum") {
    const Value attr = param(args, kwargs, 0, "attribute", Value::none());
    Value total = param(args, kwargs, 1, "start", Value::from_int(0));
    for (const auto& item : iterate(input)) {
      const Value v = attr.is_none() ? item : attribute_of(item, to_str(attr));
      if (!v.is_number() || !total.is_number()) fail("chat template: sum needs numbers");
      total = (total.kind == Kind::Float || v.kind == Kind::Float)
                  ? Value::from_float(total.as_double() + v.as_double())
                  : Value::from_int(static_cast<int64_t>(total.as_double() + v.as_double()));
    }
    return total;
  }
  if (name == "format") return Value::from_string(percent_format(to_str(input), args));
  if (name == "wordcount")
    return Value::from_int(static_cast<int64_t>(split_whitespace(to_str(input), -1).size()));
  fail("chat template: unsupported construct: filter '", name, "'");
}

bool apply_test(const std::string& name, const Value& v, List& args) {
  auto other = [&]() -> const Value& {
    if (args.empty()) fail("chat template: test '", name, "' needs an argument");
    return args[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict() && !v.dict->is_namespace;
  if (name == "iterable") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "sequence")
    return v.is_string() || v.is_list() || (v.is_dict() && !v.dict->is_namespace);
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind == Kind::Int;
  if (name == "float") return v.kind == Kind::Float;
  if (name == "boolean") return v.kind == Kind::Bool;
  if (name == "true") return v.kind == Kind::Bool && v.boolean;
  if (name == "false") return v.kind == Kind::Bool && !v.boolean;
  if (name == "callable") return v.kind == Kind::Callable;
  if (name == "equalto" || name == "eq" || name == "==") return equals(v, other());
  if (name == "ne" || name == "!=") return !equals(v, other());
  if (name == "sameas") {
    const Value& o = other();
    if (v.kind != o.kind) return false;
    if (v.is_list()) return v.list == o.list;
    if (v.is_dict()) return v.dict == o.dict;
    return equals(v, o);
  }
  if (name == "lt" || name == "lessthan" || name == "<") return less_than(v, other());
  if (name == "gt" || name == "greaterthan" || name == ">") return less_than(other(), v);
  if (name == "le" || name == "<=") return !less_than(other(), v);
  if (name == "ge" || name == ">=") return !less_than(v, other());
  if (name == "in") {
    const Value& c = other();
    if (c.is_string() && v.is_string()) return c.str.find(v.str) != std::string::npos;
    if (c.is_dict()) return v.is_string() && c.dict->find(v.str);
    for (const auto& x : iterate(c))
      if (equals(x, v)) return true;
    return false;
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (v.kind != Kind::Int && v.kind != Kind::Bool)
      fail("chat template: test '", name, "' needs an integer");
    const int64_t i = v.kind == Kind::Bool ? v.boolean : v.integer;
    if (name == "odd") return i % 2 != 0;
    if (name == "even") return i % 2 == 0;
    const Value& d = other();
    if (d.kind != Kind::Int || d.integer == 0)
      fail("chat template: divisibleby needs a non-zero integer");
    return i % d.integer == 0;
  }
  if (name == "lower") return v.is_string() && ascii_lower(v.str) == v.str;
  if (name == "upper") return v.is_string() && ascii_upper(v.str) == v.str;
  fail("chat template: unsupported construct: test '", name, "'");
}

}  // namespace gyre::jinja
