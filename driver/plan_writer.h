// A plan directory written all or nothing: files go into a temporary sibling directory that
// commit() renames into place, so a failed compile never leaves a mix of two plans.
#pragma once

#include <filesystem>
#include <string>

namespace xserv::driver {

class PlanWriter {
public:
  /// Prepares a temporary directory beside `plan`. Throws UsageError when `plan` exists and is
  /// not a directory, or is a non-empty directory that holds no plan.json (compile will not
  /// replace it), and xserv::Error when the temporary directory cannot be made.
  explicit PlanWriter(std::filesystem::path plan);
  /// Removes the temporary directory unless committed.
  ~PlanWriter();
  PlanWriter(const PlanWriter&) = delete;
  PlanWriter& operator=(const PlanWriter&) = delete;

  /// Where the files go until commit().
  const std::filesystem::path& dir() const { return tmp_; }
  /// Writes `text` to dir()/`name`; throws naming the file when it cannot.
  void write(const std::string& name, const std::string& text) const;
  /// Replaces the plan directory with the temporary one (the previous plan, if any, is moved
  /// aside first and restored when the rename fails).
  void commit();

private:
  std::filesystem::path plan_, tmp_, old_;
  bool committed_ = false;
};

} // namespace xserv::driver
