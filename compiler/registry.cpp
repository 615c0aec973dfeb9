// The table of passes the pipeline string can name.
#include "compiler/cse.h"
#include "compiler/dce.h"
#include "compiler/pass.h"

namespace xserv::compiler {

const std::vector<PassInfo>& registered_passes() {
  static const std::vector<PassInfo> passes = {
      {"cse", "merge identical pure nodes", &cse},
      {"dce", "remove nodes that reach no output or state write", &dce},
  };
  return passes;
}

const PassInfo* find_pass(std::string_view name) {
  for (const auto& p : registered_passes())
    if (name == p.name)
      return &p;
  return nullptr;
}

} // namespace xserv::compiler
