#pragma once
// Helpers shared by the GoogleTest files.

#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <ATen/Context.h>
#include <c10/util/Exception.h>

namespace fuseops::testing {

// Seeds ATen's default generator (otherwise seeded from the OS, different
// every run) when the test program starts, so every run draws the same
// inputs and a failure reproduces.
inline const bool kSeeded = (at::manual_seed(0), true);

// Expects `call` to throw a c10::Error whose message contains every one of
// `fragments` (the op's name, the argument's name, what is wrong).
inline void expect_error_mentions(const std::function<void()>& call,
                                  const std::vector<std::string>& fragments) {
  try {
    call();
    ADD_FAILURE() << "expected an error";
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    for (const auto& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "'" << fragment << "' not in: " << message;
    }
  }
}

}  // namespace fuseops::testing
