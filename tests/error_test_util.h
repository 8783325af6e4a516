// One check shared by the tests of user-facing failures: the call throws gyre::Error with one
// line that mentions `needle` (the brief's "a clear error and nothing else").
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "core/error.h"

namespace gyre::testutil {

inline void expect_one_line_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error, expected one mentioning " << needle;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

}  // namespace gyre::testutil
