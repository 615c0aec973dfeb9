// Progress lines with timings for long-running work ("[compile] building the graph ... 12.3 ms"),
// on stderr, for every layer that loads or compiles something a person waits for.
#pragma once

#include <string>

namespace xserv {

/// One line per step: step() prints "[tag] what ..." and starts its clock, finish() ends the
/// line with an optional detail and the elapsed milliseconds. A step left open is finished by
/// the next step().
class Progress {
public:
  explicit Progress(std::string tag);
  void step(const std::string& what);
  void finish(const std::string& detail = "");
  /// Milliseconds since construction.
  double total_ms() const;

private:
  std::string tag_;
  double start_ = 0, step_start_ = 0;
  bool open_ = false;
};

} // namespace xserv
