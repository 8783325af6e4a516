// Chat templates: every reference rendering made by Python's jinja2 (set up as transformers
// does, see tools/make_chat_template_refs.py) must be reproduced byte for byte, and so must the
// renderings in the tokenizer fixtures' golden.json (made by another implementation).
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "tokenizer/chat_template.h"

namespace gyre {
namespace {

using ojson = nlohmann::ordered_json;

const std::string kDataDir = std::string(GYRE_SOURCE_DIR) + "/tests/data/chat_templates/";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

ojson load_json(const std::string& path) {
  return ojson::parse(read_file(path));
}

// Renders a reference case; returns the output, or "ERROR: <message>" when it throws.
std::string render_case(const std::string& tmpl, const ojson& c) {
  try {
    return render_chat_template_ordered(tmpl, c["messages"], c["add_generation_prompt"].get<bool>(),
                                        c["bos_token"].get<std::string>(),
                                        c["eos_token"].get<std::string>(), c["extra_context"]);
  } catch (const Error& e) {
    return std::string("ERROR: ") + e.what();
  }
}

TEST(ChatTemplate, RealTemplatesMatchJinja2) {
  const ojson refs = load_json(kDataDir + "cases.json");
  std::map<std::string, std::string> templates;
  for (const auto& [name, text] : refs["templates"].items())
    templates[name] = text.get<std::string>();
  for (const auto& [name, file] : refs["template_files"].items())
    templates[name] = read_file(kDataDir + file.get<std::string>());
  int checked = 0, raising = 0;
  for (const auto& c : refs["cases"]) {
    const std::string label = c["template"].get<std::string>() + "/" +
                              c["conversation"].get<std::string>() +
                              (c["add_generation_prompt"].get<bool>() ? "+gen" : "");
    const std::string got = render_case(templates.at(c["template"].get<std::string>()), c);
    if (c.contains("expected")) {
      EXPECT_EQ(got, c["expected"].get<std::string>()) << label;
    } else {
      // raise_exception(msg) must surface as a gyre::Error carrying exactly msg.
      EXPECT_EQ(got, "ERROR: " + c["error"].get<std::string>()) << label;
      ++raising;
    }
    ++checked;
  }
  EXPECT_GE(checked, 80);
  EXPECT_GE(raising, 10);
}

TEST(ChatTemplate, GoldenRenderingsOfTokenizerFixtures) {
  int checked = 0;
  for (const char* name : {"llama2", "llama3"}) {
    const std::string dir = std::string(GYRE_FIXTURES) + "/tokenizers/" + name + "/";
    const auto config = nlohmann::json::parse(read_file(dir + "tokenizer_config.json"));
    const auto golden = nlohmann::json::parse(read_file(dir + "golden.json"));
    auto token = [&](const char* key) {
      const auto& t = config[key];
      return t.is_object() ? t["content"].get<std::string>() : t.get<std::string>();
    };
    for (const auto& c : golden["chat_template_cases"]) {
      EXPECT_EQ(render_chat_template(config["chat_template"].get<std::string>(), c["messages"],
                                     c["add_generation_prompt"].get<bool>(), token("bos_token"),
                                     token("eos_token")),
                c["rendered"].get<std::string>())
          << name;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 6);
}

TEST(ChatTemplate, ExpressionsFiltersAndWhitespaceMatchJinja2) {
  const ojson refs = load_json(kDataDir + "expressions.json");
  for (const auto& c : refs["cases"]) {
    const std::string tmpl = c["template"].get<std::string>();
    std::string got;
    bool threw = false;
    try {
      // The context's keys become template variables through extra_context.
      got = render_chat_template_ordered(tmpl, ojson::array(), false, "", "", c["context"]);
    } catch (const Error& e) {
      threw = true;
      got = e.what();
    }
    if (c.contains("expected")) {
      EXPECT_FALSE(threw) << tmpl << "\n  error: " << got;
      EXPECT_EQ(got, c["expected"].get<std::string>()) << tmpl;
    } else {
      EXPECT_TRUE(threw) << tmpl << " should fail like jinja2: " << c["error"];
      if (c["error_type"] == "TemplateError") {
        EXPECT_EQ(got, c["error"].get<std::string>()) << tmpl;
      }
    }
  }
}

TEST(ChatTemplate, PlainJsonOverloadRendersExtraContext) {
  // The nlohmann::json overloads (sorted keys) must agree with jinja2 where order does not show.
  const ojson refs = load_json(kDataDir + "cases.json");
  int checked = 0;
  for (const auto& c : refs["cases"]) {
    const auto messages = nlohmann::json::parse(c["messages"].dump());
    const auto extra = nlohmann::json::parse(c["extra_context"].dump());
    // Only templates that never show a dict's key order (no tojson, no dict iteration) agree.
    const std::string t = c["template"].get<std::string>();
    if (!c.contains("expected") || t == "llama3_1_tools" || t == "qwen2_5" ||
        t == "mistral_v0_3_tools")
      continue;
    ++checked;
    const std::string name = c["template"].get<std::string>();
    const std::string tmpl =
        refs["templates"].contains(name)
            ? refs["templates"][name].get<std::string>()
            : read_file(kDataDir + refs["template_files"][name].get<std::string>());
    EXPECT_EQ(render_chat_template(tmpl, messages, c["add_generation_prompt"].get<bool>(),
                                   c["bos_token"].get<std::string>(),
                                   c["eos_token"].get<std::string>(), extra),
              c["expected"].get<std::string>());
  }
  EXPECT_GE(checked, 30);
}

std::string error_of(const std::string& tmpl,
                     const nlohmann::json& extra = nlohmann::json::object()) {
  try {
    render_chat_template(tmpl, nlohmann::json::array(), false, "", "", extra);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(ChatTemplate, UnsupportedConstructsAreNamedErrors) {
  EXPECT_NE(error_of("a\n{% include 'x.j2' %}").find("'{% include %}' (line 2)"), std::string::npos)
      << error_of("a\n{% include 'x.j2' %}");
  EXPECT_NE(error_of("{% extends 'base' %}").find("extends"), std::string::npos);
  EXPECT_NE(error_of("{% call foo() %}{% endcall %}").find("call"), std::string::npos);
  EXPECT_NE(error_of("\n\n{{ x | nosuchfilter }}").find("filter 'nosuchfilter'"),
            std::string::npos);
  EXPECT_NE(error_of("\n\n{{ x | nosuchfilter }}").find("line 3"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 is nosuchtest }}").find("test 'nosuchtest'"), std::string::npos);
  EXPECT_NE(error_of("{{ 'x'.zfill(3) }}").find("'zfill' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{% for x in y recursive %}{% endfor %}").find("recursive"),
            std::string::npos);
}

TEST(ChatTemplate, MalformedTemplatesFailCleanly) {
  for (const char* bad :
       {"{{ 1 + }}", "{% if x %}never closed", "{{ unterminated", "{% for %}", "{# comment",
        "{{ 'string }}", "{% endif %}", "{% if 1 %}{% endfor %}", "{{ (1 }}", "{{ [1, 2 }}",
        "{{ {'a' 1} }}", "{% break %}", "{% set %}", "{{ a.  }}", "{{ 99999999999999999999 }}",
        "{% raw %}x", "{{ x[] }}", "{{ 1 @ 2 }}", "{% macro m( %}"}) {
    EXPECT_NE(error_of(bad), "<no error>") << bad;
  }
}

TEST(ChatTemplate, HostileTemplatesHitLimitsNotCrashes) {
  const auto start = std::chrono::steady_clock::now();
  // Deep nesting in expressions and blocks.
  EXPECT_NE(error_of("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}")
                .find("nested too deeply"),
            std::string::npos);
  std::string deep_ifs;
  for (int i = 0; i < 5000; ++i) deep_ifs += "{% if true %}";
  EXPECT_NE(error_of(deep_ifs).find("nested too deeply"), std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(50000, '-') + "1 }}").find("nested too deeply"),
            std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(20000, '[') + std::string(20000, ']') + " }}")
                .find("nested too deeply"),
            std::string::npos);
  // Unbounded recursion, huge loops, huge output, huge values.
  EXPECT_NE(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("recursion too deep"),
            std::string::npos);
  EXPECT_NE(error_of("{% for i in range(200000) %}{% endfor %}").find("range() too large"),
            std::string::npos);
  EXPECT_NE(
      error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
          .find("too many loop iterations"),
      std::string::npos);
  EXPECT_NE(
      error_of("{% for i in range(200) %}{{ 'x' * 100000 }}{% endfor %}").find("output larger"),
      std::string::npos);
  EXPECT_NE(error_of("{{ 'x' * 10000000000 }}").find("too large"), std::string::npos);
  EXPECT_NE(error_of("{{ 2 ** 64 }}").find("overflow"), std::string::npos);
  EXPECT_NE(error_of("{{ 9223372036854775807 + 1 }}").find("overflow"), std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ "
                     "ns.s %}{% endfor %}")
                .find("too long"),
            std::string::npos);
  EXPECT_NE(error_of("{{ x.y }}").find("'x' is undefined"), std::string::npos);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 60.0);
}

}  // namespace
}  // namespace gyre
