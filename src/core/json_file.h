// Reading a JSON file with an error that names it (configs, tokenizer configs, conversion jobs).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace gyre {

// The JSON of a file; gyre::Error naming the file when it cannot be read or is not JSON.
nlohmann::json read_json_file(const std::string& path);

}  // namespace gyre
