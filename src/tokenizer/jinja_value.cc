#include "tokenizer/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace gyre::jinja {

const Value* Dict::find(const std::string& key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& [k, old] : entries)
    if (k == key) {
      old = std::move(v);
      return;
    }
  entries.emplace_back(key, std::move(v));
}

Value Value::undefined(std::string name) {
  Value v;
  v.str = std::move(name);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::None;
  return v;
}
Value Value::from_bool(bool b) {
  Value v;
  v.kind = Kind::Bool;
  v.boolean = b;
  return v;
}
Value Value::from_int(int64_t i) {
  Value v;
  v.kind = Kind::Int;
  v.integer = i;
  return v;
}
Value Value::from_float(double f) {
  Value v;
  v.kind = Kind::Float;
  v.real = f;
  return v;
}
Value Value::from_string(std::string s) {
  Value v;
  v.kind = Kind::String;
  v.str = std::move(s);
  return v;
}
Value Value::from_list(List items) {
  Value v;
  v.kind = Kind::List;
  v.list = std::make_shared<List>(std::move(items));
  return v;
}
Value Value::tuple(List items) {
  Value v = from_list(std::move(items));
  v.is_tuple = true;
  return v;
}
Value Value::new_dict() {
  Value v;
  v.kind = Kind::Dict;
  v.dict = std::make_shared<Dict>();
  return v;
}
Value Value::function(std::string name, std::function<Value(List&, Kwargs&)> call) {
  Value v;
  v.kind = Kind::Callable;
  v.fn = std::make_shared<Callable>(Callable{std::move(name), std::move(call)});
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return from_bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return from_int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) fail("chat template: integer too large: ", u);
      return from_int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return from_float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return from_string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& e : j) items.push_back(from_json(e));
      return from_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = new_dict();
      for (const auto& [k, e] : j.items()) d.dict->entries.emplace_back(k, from_json(e));
      return d;
    }
    default:
      fail("chat template: unsupported JSON value (binary or discarded)");
  }
}

double Value::as_double() const {
  if (kind == Kind::Float) return real;
  if (kind == Kind::Int) return static_cast<double>(integer);
  return boolean ? 1.0 : 0.0;
}

void fail_undefined(const Value& v) {
  if (v.str.empty()) fail("chat template: a value is undefined");
  fail("chat template: '", v.str, "' is undefined");
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return v.boolean;
    case Kind::Int:
      return v.integer != 0;
    case Kind::Float:
      return v.real != 0;
    case Kind::String:
      return !v.str.empty();
    case Kind::List:
      return !v.list->empty();
    case Kind::Dict:
      return !v.dict->entries.empty();
    case Kind::Callable:
      return true;
  }
  return false;
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::None:
      return "NoneType";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::List:
      return "list";
    case Kind::Dict:
      return v.dict->is_namespace ? "Namespace" : "dict";
    case Kind::Callable:
      return "function";
  }
  return "?";
}

std::string format_float(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, then laid out the way Python's float repr does: positional for
  // decimal exponents -4..15, scientific (two-digit exponent at least) otherwise.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t e_pos = sci.find('e');
  std::string mantissa = sci.substr(0, e_pos);
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string sign;
  if (mantissa[0] == '-') {
    sign = "-";
    mantissa.erase(0, 1);
  }
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits += c;
  if (exponent < -4 || exponent >= 16) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + ebuf;
  }
  if (exponent < 0) return sign + "0." + std::string(-exponent - 1, '0') + digits;
  const size_t int_len = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= int_len)
    return sign + digits + std::string(int_len - digits.size(), '0') + ".0";
  return sign + digits.substr(0, int_len) + "." + digits.substr(int_len);
}

static std::string repr_string(const std::string& s) {
  const bool use_double = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char quote = use_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == quote)
      out += std::string("\\") + static_cast<char>(c);
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + quote;
}

std::string repr(const Value& v) {
  switch (v.kind) {
    case Kind::String:
      return repr_string(v.str);
    case Kind::List: {
      std::string out = v.is_tuple ? "(" : "[";
      for (size_t i = 0; i < v.list->size(); ++i) out += (i ? ", " : "") + repr((*v.list)[i]);
      if (v.is_tuple) return out + (v.list->size() == 1 ? ",)" : ")");
      return out + "]";
    }
    case Kind::Dict: {
      if (v.dict->is_namespace) return "<Namespace>";
      std::string out = "{";
      bool first = true;
      for (const auto& [k, e] : v.dict->entries) {
        out += (first ? "" : ", ") + repr_string(k) + ": " + repr(e);
        first = false;
      }
      return out + "}";
    }
    default:
      return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return "";
    case Kind::None:
      return "None";
    case Kind::Bool:
      return v.boolean ? "True" : "False";
    case Kind::Int:
      return std::to_string(v.integer);
    case Kind::Float:
      return format_float(v.real);
    case Kind::String:
      return v.str;
    case Kind::Callable:
      return "<function " + v.fn->name + ">";
    default:
      return repr(v);
  }
}

static std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

static void dump_json(const Value& v, int indent, bool sort_keys, int depth, std::string& out) {
  GYRE_CHECK(depth < 256, "chat template: tojson: value nested too deeply");
  const std::string newline = indent >= 0 ? "\n" + std::string((depth + 1) * indent, ' ') : "";
  const std::string close = indent >= 0 ? "\n" + std::string(depth * indent, ' ') : "";
  const std::string item_sep = indent >= 0 ? "," : ", ";
  switch (v.kind) {
    case Kind::None:
      out += "null";
      return;
    case Kind::Bool:
      out += v.boolean ? "true" : "false";
      return;
    case Kind::Int:
      out += std::to_string(v.integer);
      return;
    case Kind::Float:
      if (std::isnan(v.real))
        out += "NaN";
      else if (std::isinf(v.real))
        out += v.real > 0 ? "Infinity" : "-Infinity";
      else
        out += format_float(v.real);
      return;
    case Kind::String:
      out += json_string(v.str);
      return;
    case Kind::List:
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += "[";
      for (size_t i = 0; i < v.list->size(); ++i) {
        out += (i ? item_sep : "") + newline;
        dump_json((*v.list)[i], indent, sort_keys, depth + 1, out);
      }
      out += close + "]";
      return;
    case Kind::Dict: {
      if (v.dict->entries.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& e : v.dict->entries) entries.push_back(&e);
      if (sort_keys)
        std::stable_sort(entries.begin(), entries.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      out += "{";
      for (size_t i = 0; i < entries.size(); ++i) {
        out += (i ? item_sep : "") + newline + json_string(entries[i]->first) + ": ";
        dump_json(entries[i]->second, indent, sort_keys, depth + 1, out);
      }
      out += close + "}";
      return;
    }
    default:
      fail("chat template: tojson: object of type ", type_name(v), " is not JSON serializable");
  }
}

std::string to_json(const Value& v, int indent, bool sort_keys) {
  std::string out;
  dump_json(v, indent, sort_keys, 0, out);
  return out;
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::Float || b.kind == Kind::Float) return a.as_double() == b.as_double();
    const int64_t x = a.kind == Kind::Bool ? a.boolean : a.integer;
    const int64_t y = b.kind == Kind::Bool ? b.boolean : b.integer;
    return x == y;
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None:
      return true;
    case Kind::String:
      return a.str == b.str;
    case Kind::List:
      if (a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i)
        if (!equals((*a.list)[i], (*b.list)[i])) return false;
      return true;
    case Kind::Dict:
      if (a.dict == b.dict) return true;
      if (a.dict->is_namespace || b.dict->is_namespace) return false;
      if (a.dict->entries.size() != b.dict->entries.size()) return false;
      for (const auto& [k, v] : a.dict->entries) {
        const Value* other = b.dict->find(k);
        if (!other || !equals(v, *other)) return false;
      }
      return true;
    case Kind::Callable:
      return a.fn == b.fn;
    default:
      return false;
  }
}

bool less_than(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_double() < b.as_double();
  if (a.is_string() && b.is_string()) return a.str < b.str;
  if (a.is_list() && b.is_list()) {
    const List& x = *a.list;
    const List& y = *b.list;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (less_than(x[i], y[i])) return true;
      if (less_than(y[i], x[i])) return false;
    }
    return x.size() < y.size();
  }
  fail("chat template: '<' not supported between instances of '", type_name(a), "' and '",
       type_name(b), "'");
}

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

List iterate(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return {};
    case Kind::List:
      return *v.list;
    case Kind::Dict: {
      List keys;
      for (const auto& e : v.dict->entries) keys.push_back(Value::from_string(e.first));
      return keys;
    }
    case Kind::String: {
      List chars;
      for (auto& c : utf8_chars(v.str)) chars.push_back(Value::from_string(std::move(c)));
      return chars;
    }
    default:
      fail("chat template: '", type_name(v), "' object is not iterable");
  }
}

int64_t length(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return 0;
    case Kind::String:
      return static_cast<int64_t>(utf8_chars(v.str).size());
    case Kind::List:
      return static_cast<int64_t>(v.list->size());
    case Kind::Dict:
      return static_cast<int64_t>(v.dict->entries.size());
    default:
      fail("chat template: object of type '", type_name(v), "' has no len()");
  }
}

}  // namespace gyre::jinja
