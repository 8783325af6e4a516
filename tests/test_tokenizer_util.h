// Shared helpers for the tokenizer tests: fixture paths, JSON loading, tokenizers loaded once.
#pragma once
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tokenizer/tokenizer.h"

namespace gyre::test {

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string tokenizer_dir(const std::string& name) {
  if (name == "stories260K") return std::string(GYRE_FIXTURES) + "/stories260K";
  return std::string(GYRE_FIXTURES) + "/tokenizers/" + name;
}

inline nlohmann::json load_json(const std::string& path) {
  return nlohmann::json::parse(read_text(path));
}

// Loading the 128k-token Llama 3 file takes a while; each test binary loads each folder once.
inline const Tokenizer& hf_tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[name];
  if (!slot) slot = Tokenizer::from_folder(tokenizer_dir(name));
  return *slot;
}

inline std::vector<int> ids_of(const nlohmann::json& j) {
  return j.get<std::vector<int>>();
}

}  // namespace gyre::test
