// share_plan / loaded_plan: plan.json read once per process; and PlanFile, the transitional
// view of it for the CUDA model.
#include "cli/plan_file.h"

#include <mutex>

#include "runtime/layout_json.h"
#include "runtime/plan_io.h"
#include "runtime/plan_json.h"

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

std::string PlanFile::field_error(const std::string& field, const std::string& what) const {
  return runtime::plan_field_error(dir, field, what);
}

PlanFile read_plan_file(const fs::path& dir) {
  const std::shared_ptr<const runtime::Plan> plan = loaded_plan(dir);
  PlanFile f;
  f.dir = dir;
  f.file = dir / "plan.json";
  f.has_codegen = plan->stages.size() == 1;
  if (plan->pipelined())
    for (const runtime::PlanStage& s : plan->stages)
      f.stage_graphs.push_back(s.graph);
  if (f.has_codegen)
    f.doc["codegen"] = {{"layout", runtime::stage_layout_to_json(plan->stages[0].layout)},
                        {"launch_table", runtime::launch_table_to_json(plan->stages[0].table)}};
  return f;
}

} // namespace xserv::cli
