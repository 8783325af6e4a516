// Evaluator of the Jinja engine: walks the syntax tree, with jinja2's scoping (each for-loop
// iteration and each macro call gets its own scope; `namespace()` objects carry state out).
#pragma once
#include <string>

#include "tokenizer/jinja_ast.h"

namespace gyre::jinja {

// Renders a parsed template with `variables` (a dict Value) on top of the globals.
std::string render(const Body& body, const Value& variables);

}  // namespace gyre::jinja
