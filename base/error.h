// The error types every xserv library throws for user-facing problems (bad input, bad config,
// a flag that does not fit), and XSERV_CHECK for internal invariants.
#pragma once

#include <stdexcept>
#include <string>

namespace xserv {

/// A problem caused by input the user controls: a path, a config field, a checkpoint byte, a
/// flag. The message is complete and names the file, field or limit; the CLI prints it as is
/// and exits non-zero. Internal invariant failures use XSERV_CHECK instead.
class Error : public std::runtime_error {
public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

/// A mistake in how xserv was called (unknown flag, missing value, bad path, a flag a plan was
/// not compiled for): the CLI exits with 2 instead of 1.
class UsageError : public Error {
public:
  using Error::Error;
};

/// Aborts with a message when an internal invariant does not hold (a bug, never user input).
[[noreturn]] void check_failed(const char* expr, const char* file, int line,
                               const std::string& msg);

#define XSERV_CHECK(cond, msg)                                                                     \
  do {                                                                                             \
    if (!(cond))                                                                                   \
      ::xserv::check_failed(#cond, __FILE__, __LINE__, (msg));                                     \
  } while (0)

} // namespace xserv
