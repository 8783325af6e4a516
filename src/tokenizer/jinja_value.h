// Values of the Jinja engine that renders chat templates. They follow Python's semantics (as
// jinja2 runs on Python): truthiness, str()/repr() spelling, == across int/float/bool, and
// json.dumps for the tojson filter. Lists and dicts are shared by reference like Python objects;
// dicts keep insertion order because Python dicts (and so transformers' tojson) do.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace gyre::jinja {

struct Value;
using List = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;

struct Dict {
  std::vector<std::pair<std::string, Value>> entries;
  bool is_namespace = false;  // made by namespace(): the only object `set ns.attr = ...` may change
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v);
};

struct Callable {
  std::string name;
  std::function<Value(List& args, Kwargs& kwargs)> call;
};

enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Callable };

struct Value {
  Kind kind = Kind::Undefined;
  bool boolean = false;
  bool is_tuple = false;  // a List that Python would hold as a tuple: repr uses ( )
  int64_t integer = 0;
  double real = 0;
  std::string str;  // the text of a String; the missing name of an Undefined (for its error)
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Callable> fn;

  static Value undefined(std::string name = {});
  static Value none();
  static Value from_bool(bool b);
  static Value from_int(int64_t i);
  static Value from_float(double f);
  static Value from_string(std::string s);
  static Value from_list(List items = {});
  static Value tuple(List items);
  static Value new_dict();
  static Value function(std::string name, std::function<Value(List&, Kwargs&)> call);
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_list() const { return kind == Kind::List; }
  bool is_dict() const { return kind == Kind::Dict; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  double as_double() const;
};

[[noreturn]] void fail_undefined(const Value& v);
bool truthy(const Value& v);
std::string type_name(const Value& v);
std::string to_str(const Value& v);  // Python str()
std::string repr(const Value& v);    // Python repr()
std::string format_float(double f);  // Python repr of a float
// json.dumps(v, ensure_ascii=False, indent=indent, sort_keys=sort_keys); indent < 0: one line.
std::string to_json(const Value& v, int indent, bool sort_keys);
bool equals(const Value& a, const Value& b);
bool less_than(const Value& a, const Value& b);  // Python <; throws on unorderable types
// The items a for loop or list() sees: list items, dict keys, string characters (UTF-8).
List iterate(const Value& v);
int64_t length(const Value& v);
std::vector<std::string> utf8_chars(const std::string& s);

}  // namespace gyre::jinja
