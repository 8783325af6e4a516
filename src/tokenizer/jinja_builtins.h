// Filters, tests, globals and attribute/method lookup of the Jinja engine, with jinja2's
// behaviour (and Python's for str/dict methods). Everything here works on plain Values.
#pragma once
#include <string>

#include "tokenizer/jinja_value.h"

namespace gyre::jinja {

// Size caps that keep hostile templates from exhausting memory.
constexpr size_t kMaxStringBytes = 8u << 20;
constexpr size_t kMaxListItems = 100'000;

Value apply_filter(const std::string& name, const Value& input, List& args, Kwargs& kwargs);
bool apply_test(const std::string& name, const Value& input, List& args);
// obj.name: dict key or dict/str method; undefined when missing. Throws on an Undefined obj.
Value get_attr(const Value& obj, const std::string& name);
// obj[key]: list index, dict key, string character; falls back to get_attr for string keys.
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] for lists and strings (null pointers for left-out bounds).
Value get_slice(const Value& obj, const Value* start, const Value* stop, const Value* step);
// The global functions (range, namespace, dict, raise_exception, strftime_now) as a dict.
Value make_globals();

}  // namespace gyre::jinja
