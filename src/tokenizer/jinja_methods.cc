// Attribute, item and slice access, Python str/dict methods, and the global functions.
#include <chrono>
#include <ctime>

#include "core/error.h"
#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_strings.h"

namespace gyre::jinja {
namespace {

const Value& arg(List& args, size_t i, const char* method) {
  if (i >= args.size()) fail("chat template: ", method, "() is missing an argument");
  return args[i];
}

const std::string& str_arg(List& args, size_t i, const char* method) {
  const Value& v = arg(args, i, method);
  if (!v.is_string()) fail("chat template: ", method, "() needs a string, not ", type_name(v));
  return v.str;
}

std::string strip_arg(List& args) {
  if (args.empty() || args[0].is_none()) return kWhitespace;
  return str_arg(args, 0, "strip");
}

bool prefix_test(const std::string& s, const Value& what, bool at_end) {
  auto one = [&](const Value& p) {
    if (!p.is_string()) fail("chat template: startswith/endswith needs strings");
    if (p.str.size() > s.size()) return false;
    return at_end ? s.compare(s.size() - p.str.size(), p.str.size(), p.str) == 0
                  : s.compare(0, p.str.size(), p.str) == 0;
  };
  if (what.is_list()) {
    for (const auto& p : *what.list)
      if (one(p)) return true;
    return false;
  }
  return one(what);
}

// str.format with "{}", "{0}", "{name}" fields and "{{" / "}}" (no format specs).
std::string python_format(const std::string& fmt, List& args, Kwargs& kwargs) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if ((c == '{' || c == '}') && i + 1 < fmt.size() && fmt[i + 1] == c) {
      out += c;
      ++i;
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == std::string::npos) fail("chat template: format(): single '{' in format string");
    const std::string field = fmt.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!") != std::string::npos)
      fail("chat template: unsupported construct: format spec '", field, "' in str.format");
    const Value* v = nullptr;
    if (field.empty()) {
      v = &arg(args, auto_index++, "format");
    } else if (std::isdigit(static_cast<unsigned char>(field[0]))) {
      v = &arg(args, std::stoul(field), "format");
    } else {
      for (auto& [k, kv] : kwargs)
        if (k == field) v = &kv;
      if (!v) fail("chat template: format(): no argument named '", field, "'");
    }
    out += to_str(*v);
    i = close;
  }
  return out;
}

Value string_method(const std::string& s, const std::string& name, List& args, Kwargs& kwargs) {
  if (name == "strip") return Value::from_string(strip_chars(s, strip_arg(args), true, true));
  if (name == "lstrip") return Value::from_string(strip_chars(s, strip_arg(args), true, false));
  if (name == "rstrip") return Value::from_string(strip_chars(s, strip_arg(args), false, true));
  if (name == "upper") return Value::from_string(ascii_upper(s));
  if (name == "lower") return Value::from_string(ascii_lower(s));
  if (name == "title") return Value::from_string(python_title(s));
  if (name == "capitalize") return Value::from_string(capitalize(s));
  if (name == "startswith")
    return Value::from_bool(prefix_test(s, arg(args, 0, name.c_str()), false));
  if (name == "endswith") return Value::from_bool(prefix_test(s, arg(args, 0, name.c_str()), true));
  if (name == "split" || name == "rsplit") {
    int64_t maxsplit = -1;
    if (args.size() > 1) maxsplit = arg(args, 1, "split").integer;
    for (auto& [k, v] : kwargs)
      if (k == "maxsplit") maxsplit = v.integer;
    if (name == "rsplit" && maxsplit >= 0)
      fail("chat template: unsupported construct: rsplit with maxsplit");
    const bool has_sep = !args.empty() && !args[0].is_none();
    List parts;
    for (auto& p :
         has_sep ? split_on(s, str_arg(args, 0, "split"), maxsplit) : split_whitespace(s, maxsplit))
      parts.push_back(Value::from_string(std::move(p)));
    return Value::from_list(std::move(parts));
  }
  if (name == "replace") {
    int64_t count = args.size() > 2 ? args[2].integer : -1;
    return Value::from_string(
        replace_all(s, str_arg(args, 0, "replace"), str_arg(args, 1, "replace"), count));
  }
  if (name == "find") {
    const size_t at = s.find(str_arg(args, 0, "find"));
    return Value::from_int(
        at == std::string::npos ? -1 : static_cast<int64_t>(utf8_chars(s.substr(0, at)).size()));
  }
  if (name == "count") {
    const std::string& needle = str_arg(args, 0, "count");
    int64_t n = 0;
    if (needle.empty()) return Value::from_int(static_cast<int64_t>(utf8_chars(s).size()) + 1);
    for (size_t at = s.find(needle); at != std::string::npos;
         at = s.find(needle, at + needle.size()))
      ++n;
    return Value::from_int(n);
  }
  if (name == "join") {
    std::string out;
    bool first = true;
    for (const auto& item : iterate(arg(args, 0, "join"))) {
      if (!item.is_string())
        fail("chat template: join(): sequence item is ", type_name(item), ", not str");
      out += (first ? "" : s) + item.str;
      first = false;
    }
    return Value::from_string(std::move(out));
  }
  if (name == "format") return Value::from_string(python_format(s, args, kwargs));
  if (name == "splitlines") {
    List lines;
    for (auto& l : split_lines(s)) lines.push_back(Value::from_string(std::move(l)));
    return Value::from_list(std::move(lines));
  }
  if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum" ||
      name == "islower" || name == "isupper")
    return Value::from_bool(char_class_test(s, name));
  fail("chat template: unsupported construct: str method '", name, "'");
}

const char* const kStringMethods[] = {
    "strip",      "lstrip",  "rstrip",  "upper",   "lower",   "title",   "capitalize", "startswith",
    "endswith",   "split",   "rsplit",  "replace", "find",    "count",   "join",       "format",
    "splitlines", "isdigit", "isalpha", "isspace", "isalnum", "islower", "isupper"};

Value dict_method(const Value& d, const std::string& name, List& args) {
  if (name == "items") {
    List out;
    for (const auto& [k, v] : d.dict->entries)
      out.push_back(Value::tuple({Value::from_string(k), v}));
    return Value::from_list(std::move(out));
  }
  if (name == "keys") return Value::from_list(iterate(d));
  if (name == "values") {
    List out;
    for (const auto& e : d.dict->entries) out.push_back(e.second);
    return Value::from_list(std::move(out));
  }
  // get
  const Value& key = arg(args, 0, "get");
  const Value* found = key.is_string() ? d.dict->find(key.str) : nullptr;
  if (found) return *found;
  return args.size() > 1 ? args[1] : Value::none();
}

int64_t clamp_index(const Value* v, int64_t len, int64_t step, bool is_start) {
  if (!v || v->is_none()) return step > 0 ? (is_start ? 0 : len) : (is_start ? len - 1 : -1);
  if (v->kind != Kind::Int && v->kind != Kind::Bool)
    fail("chat template: slice indices must be integers");
  int64_t i = v->kind == Kind::Bool ? v->boolean : v->integer;
  if (i < 0) i += len;
  if (step > 0) return std::clamp<int64_t>(i, 0, len);
  return std::clamp<int64_t>(i, -1, len - 1);
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_dict()) {
    if (!obj.dict->is_namespace &&
        (name == "items" || name == "keys" || name == "values" || name == "get")) {
      Value self = obj;
      return Value::function(
          name, [self, name](List& args, Kwargs&) { return dict_method(self, name, args); });
    }
    const Value* found = obj.dict->find(name);
    return found ? *found : Value::undefined(name);
  }
  if (obj.is_string()) {
    for (const char* m : kStringMethods)
      if (name == m) {
        std::string self = obj.str;
        return Value::function(name, [self, name](List& args, Kwargs& kwargs) {
          return string_method(self, name, args, kwargs);
        });
      }
  }
  return Value::undefined(name);
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_dict() && key.is_string()) {
    const Value* found = obj.dict->find(key.str);
    return found ? *found : get_attr(obj, key.str);
  }
  if ((obj.is_list() || obj.is_string()) && (key.kind == Kind::Int || key.kind == Kind::Bool)) {
    int64_t i = key.kind == Kind::Bool ? key.boolean : key.integer;
    if (obj.is_list()) {
      const int64_t n = static_cast<int64_t>(obj.list->size());
      if (i < 0) i += n;
      return i >= 0 && i < n ? (*obj.list)[static_cast<size_t>(i)] : Value::undefined();
    }
    const auto chars = utf8_chars(obj.str);
    const int64_t n = static_cast<int64_t>(chars.size());
    if (i < 0) i += n;
    return i >= 0 && i < n ? Value::from_string(chars[static_cast<size_t>(i)]) : Value::undefined();
  }
  if (key.is_string()) return get_attr(obj, key.str);
  return Value::undefined();
}

Value get_slice(const Value& obj, const Value* start, const Value* stop, const Value* step_v) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (!obj.is_list() && !obj.is_string())
    fail("chat template: '", type_name(obj), "' object is not subscriptable");
  int64_t step = 1;
  if (step_v && !step_v->is_none()) step = step_v->integer;
  if (step == 0) fail("chat template: slice step cannot be zero");
  const List items = obj.is_list() ? *obj.list : iterate(obj);
  const int64_t len = static_cast<int64_t>(items.size());
  const int64_t from = clamp_index(start, len, step, true),
                to = clamp_index(stop, len, step, false);
  List out;
  for (int64_t i = from; step > 0 ? i < to : i > to; i += step)
    out.push_back(items[static_cast<size_t>(i)]);
  if (obj.is_list()) return Value::from_list(std::move(out));
  std::string s;
  for (const auto& c : out) s += c.str;
  return Value::from_string(std::move(s));
}

Value make_globals() {
  Value g = Value::new_dict();
  g.dict->set("range", Value::function("range", [](List& args, Kwargs&) {
                int64_t lo = 0, hi = 0, step = 1;
                for (const auto& a : args)
                  if (a.kind != Kind::Int && a.kind != Kind::Bool)
                    fail("chat template: range() needs integers");
                if (args.size() == 1)
                  hi = args[0].integer;
                else if (args.size() >= 2)
                  lo = args[0].integer, hi = args[1].integer;
                if (args.size() == 3) step = args[2].integer;
                if (args.empty() || args.size() > 3 || step == 0)
                  fail("chat template: bad range() arguments");
                const double count = std::ceil((static_cast<double>(hi) - static_cast<double>(lo)) /
                                               static_cast<double>(step));
                if (count > static_cast<double>(kMaxListItems))
                  fail("chat template: range() too large");
                List out;
                for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step)
                  out.push_back(Value::from_int(i));
                return Value::from_list(std::move(out));
              }));
  auto make_dict = [](bool is_namespace) {
    return [is_namespace](List& args, Kwargs& kwargs) {
      Value d = Value::new_dict();
      d.dict->is_namespace = is_namespace;
      for (const auto& a : args) {
        if (!a.is_dict())
          fail("chat template: namespace()/dict() takes a dict or keyword arguments");
        for (const auto& [k, v] : a.dict->entries) d.dict->set(k, v);
      }
      for (auto& [k, v] : kwargs) d.dict->set(k, v);
      return d;
    };
  };
  g.dict->set("namespace", Value::function("namespace", make_dict(true)));
  g.dict->set("dict", Value::function("dict", make_dict(false)));
  g.dict->set("raise_exception",
              Value::function("raise_exception", [](List& args, Kwargs&) -> Value {
                throw Error(args.empty() ? std::string("chat template raised an exception")
                                         : to_str(args[0]));
              }));
  g.dict->set("strftime_now", Value::function("strftime_now", [](List& args, Kwargs&) {
                const std::string& fmt = str_arg(args, 0, "strftime_now");
                const std::time_t now =
                    std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
                std::tm local{};
                localtime_r(&now, &local);
                char buf[512];
                const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &local);
                return Value::from_string(std::string(buf, n));
              }));
  return g;
}

}  // namespace gyre::jinja
