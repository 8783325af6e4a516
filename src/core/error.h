// Errors: every failure the user can cause (bad file, bad option, bad JSON) is a gyre::Error
// carrying one human-readable line; the CLI prints it and exits non-zero.
#pragma once
#include <stdexcept>
#include <string>
#include <utility>

namespace gyre {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// Concatenates its arguments with operator<< into the message of an Error.
template <typename... Args>
[[noreturn]] void fail(Args&&... args);

}  // namespace gyre

#include <sstream>

namespace gyre {
template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  throw Error(os.str());
}

#define GYRE_CHECK(cond, ...)               \
  do {                                      \
    if (!(cond)) ::gyre::fail(__VA_ARGS__); \
  } while (0)

}  // namespace gyre
