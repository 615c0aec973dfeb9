// Progress lines with timings for long-running work.
#include "base/progress.h"

#include <chrono>
#include <cstdio>

#include <fmt/format.h>

namespace xserv {
namespace {
double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
} // namespace

Progress::Progress(std::string tag) : tag_(std::move(tag)), start_(now_ms()) {}

void Progress::step(const std::string& what) {
  if (open_)
    finish();
  std::fprintf(stderr, "[%s] %s ...", tag_.c_str(), what.c_str());
  std::fflush(stderr);
  step_start_ = now_ms();
  open_ = true;
}

void Progress::finish(const std::string& detail) {
  if (!open_)
    return;
  std::string tail =
      fmt::format(" {}{:.1f} ms\n", detail.empty() ? "" : detail + ", ", now_ms() - step_start_);
  std::fputs(tail.c_str(), stderr);
  open_ = false;
}

double Progress::total_ms() const {
  return now_ms() - start_;
}

} // namespace xserv
