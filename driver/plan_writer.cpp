// PlanWriter: a temporary sibling directory renamed into place once the plan is complete.
#include "driver/plan_writer.h"

#include <fstream>

#include <unistd.h>

#include <fmt/format.h>

#include "base/error.h"

namespace xserv::driver {
namespace fs = std::filesystem;

PlanWriter::PlanWriter(fs::path plan) : plan_(std::move(plan)) {
  const fs::path abs = fs::absolute(plan_).lexically_normal();
  const fs::path name = abs.has_filename() ? abs.filename() : abs.parent_path().filename();
  const fs::path parent = abs.has_filename() ? abs.parent_path() : abs.parent_path().parent_path();
  std::error_code ec;
  if (fs::exists(plan_, ec) && !fs::is_directory(plan_, ec))
    throw UsageError(fmt::format("-o {}: exists and is not a directory", plan_.string()));
  if (fs::is_directory(plan_, ec) && !fs::is_empty(plan_, ec) && !fs::exists(plan_ / "plan.json"))
    throw UsageError(fmt::format("-o {}: a non-empty directory that holds no plan.json; "
                                 "compile will not replace it (choose another -o)",
                                 plan_.string()));
  fs::create_directories(parent, ec);
  const std::string tag = fmt::format(".{}.{}", name.string(), ::getpid());
  tmp_ = parent / (tag + ".tmp");
  old_ = parent / (tag + ".old");
  fs::remove_all(tmp_, ec);
  fs::create_directories(tmp_, ec);
  if (ec)
    throw Error(fmt::format("{}: cannot create directory: {}", tmp_.string(), ec.message()));
}

PlanWriter::~PlanWriter() {
  std::error_code ec;
  if (!committed_)
    fs::remove_all(tmp_, ec);
}

void PlanWriter::write(const std::string& name, const std::string& text) const {
  const fs::path path = tmp_ / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.flush())
    throw Error(fmt::format("{}: cannot write", path.string()));
}

void PlanWriter::commit() {
  std::error_code ec;
  const bool had_old = fs::exists(plan_, ec);
  if (had_old) {
    fs::remove_all(old_, ec);
    fs::rename(plan_, old_, ec);
    if (ec)
      throw Error(
          fmt::format("{}: cannot move the previous plan aside: {}", plan_.string(), ec.message()));
  }
  fs::rename(tmp_, plan_, ec);
  if (ec) {
    std::error_code ignored;
    if (had_old)
      fs::rename(old_, plan_, ignored);
    throw Error(fmt::format("{}: cannot rename {} into place: {}", plan_.string(), tmp_.string(),
                            ec.message()));
  }
  committed_ = true;
  if (had_old)
    fs::remove_all(old_, ec);
}

} // namespace xserv::driver
