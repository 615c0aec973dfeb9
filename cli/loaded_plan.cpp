// share_plan / loaded_plan: plan.json read once per process.
#include "cli/loaded_plan.h"

#include <mutex>

#include "runtime/plan_io.h"

namespace xserv::cli {
namespace fs = std::filesystem;

namespace {

struct Shared {
  std::mutex lock;
  fs::path dir;
  std::shared_ptr<const runtime::Plan> plan;
};

Shared& shared() {
  static Shared s;
  return s;
}

fs::path key(const fs::path& dir) {
  std::error_code ec;
  const fs::path abs = fs::absolute(dir, ec);
  return (ec ? dir : abs).lexically_normal();
}

} // namespace

void share_plan(const fs::path& dir, std::shared_ptr<const runtime::Plan> plan) {
  Shared& s = shared();
  std::lock_guard<std::mutex> hold(s.lock);
  s.dir = key(dir);
  s.plan = std::move(plan);
}

std::shared_ptr<const runtime::Plan> loaded_plan(const fs::path& dir) {
  {
    Shared& s = shared();
    std::lock_guard<std::mutex> hold(s.lock);
    if (s.plan && s.dir == key(dir))
      return s.plan;
  }
  return std::make_shared<const runtime::Plan>(runtime::read_plan(dir));
}

} // namespace xserv::cli
