// PassManager: runs a list of named passes with dumps, verification and timings.
#pragma once

#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "compiler/pass.h"

namespace xserv::compiler {

/// Debugging switches, as `xserv compile` exposes them.
struct PassManagerOptions {
  std::vector<std::string> dump_after; ///< pass names whose output IR is printed ("all" too)
  bool verify_after_all = false;       ///< run ir::verify after every pass
  int stop_after = -1;                 ///< run only the first N passes (bisecting); -1: all
  std::filesystem::path dump_dir;      ///< when set, write NN_pass.ir after each pass
  /// 0 quiet; 1 pass names and timings; 2 also the IR after each pass (compile sets it from
  /// XSERV_DEBUG, cli/env.h).
  int debug = 0;
  std::ostream* log = nullptr; ///< where dumps and timings go (stderr when null)
};

struct PassTiming {
  std::string name;
  double ms = 0;
  bool changed = false;
  size_t nodes_after = 0;
};

class PassManager {
public:
  explicit PassManager(PassManagerOptions opts = {}, PassOptions pass_opts = {});

  /// Appends the passes of a comma-separated list ("cse,dce"). Throws xserv::Error naming
  /// an unknown pass and listing the known ones.
  void add_passes(std::string_view list);
  void add(std::string_view pass_name);

  /// Runs the passes. The input is verified first; with verify_after_all, after each pass
  /// too (a failure names the pass). Returns the final graph.
  ir::Graph run(ir::Graph g);

  const std::vector<PassTiming>& timings() const { return timings_; }
  const std::vector<const PassInfo*>& passes() const { return passes_; }

private:
  std::ostream& log() const;
  PassManagerOptions opts_;
  PassOptions pass_opts_;
  std::vector<const PassInfo*> passes_;
  std::vector<PassTiming> timings_;
};

} // namespace xserv::compiler
