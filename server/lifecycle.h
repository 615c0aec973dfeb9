// Where a server is in its life: loading, ready, draining, or broken (its model can run no more
// steps), which /health reports and every endpoint checks.
#pragma once

#include <atomic>
#include <mutex>
#include <string>

namespace xserv::server {

/// The server's phase, safe to read from any thread. Draining and broken are for good.
class Lifecycle {
public:
  enum class Phase { Loading, Ready, Draining, Broken };

  Phase phase() const { return phase_.load(std::memory_order_acquire); }
  bool ready() const { return phase() == Phase::Ready; }
  void set_ready() {
    Phase want = Phase::Loading;
    phase_.compare_exchange_strong(want, Phase::Ready, std::memory_order_acq_rel);
  }
  /// From Loading or Ready; a broken server stays broken while it drains.
  void set_draining() {
    for (Phase p = phase(); p == Phase::Loading || p == Phase::Ready;)
      if (phase_.compare_exchange_weak(p, Phase::Draining, std::memory_order_acq_rel))
        break;
  }
  /// Records why the model cannot serve; returns false when it was broken already.
  bool set_broken(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!why_.empty())
      return false;
    why_ = why;
    phase_.store(Phase::Broken, std::memory_order_release);
    return true;
  }
  /// Why the model cannot serve ("" while it can).
  std::string broken() const {
    std::lock_guard<std::mutex> lock(mu_);
    return why_;
  }
  /// The word /health reports: loading, ok, draining, broken.
  const char* name() const {
    switch (phase()) {
    case Phase::Loading:
      return "loading";
    case Phase::Ready:
      return "ok";
    case Phase::Draining:
      return "draining";
    case Phase::Broken:
      return "broken";
    }
    return "?";
  }

private:
  std::atomic<Phase> phase_{Phase::Loading};
  mutable std::mutex mu_;
  std::string why_;
};

} // namespace xserv::server
