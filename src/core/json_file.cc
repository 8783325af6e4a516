#include "core/json_file.h"

#include "core/error.h"
#include "core/mapped_file.h"

namespace gyre {

nlohmann::json read_json_file(const std::string& path) {
  const std::string text = read_text_file(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("malformed JSON in '", path, "': ", e.what());
  }
}

}  // namespace gyre
