// Internal invariant failures: print the offending expression and message, then abort.
#include "base/error.h"

#include <cstdio>
#include <cstdlib>

namespace xserv {

void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "xserv: internal error at %s:%d: check `%s` failed\n%s\n", file, line, expr,
               msg.c_str());
  std::abort();
}

} // namespace xserv
