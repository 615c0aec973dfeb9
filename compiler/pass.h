// The pass interface: a pass maps a graph to a new graph and says whether anything changed.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace xserv::compiler {

/// Options every pass may read. Later passes (partitioning, kernel selection) add fields.
struct PassOptions {
  int pipeline_stages = 1; ///< --pp N
};

struct PassResult {
  ir::Graph graph;
  bool changed = false;
};

using PassFn = PassResult (*)(const ir::Graph&, const PassOptions&);

struct PassInfo {
  const char* name;
  const char* summary;
  PassFn run;
};

/// Every pass a pass list may name, in a stable order.
const std::vector<PassInfo>& registered_passes();
/// The pass named `name`, or nullptr.
const PassInfo* find_pass(std::string_view name);

/// The default pass list of `xserv compile`: cleanup, then the fusions (fuse_qkv before
/// fuse_rmsnorm_linear, which would otherwise split the attention norm over three linears),
/// then a final sweep.
inline constexpr const char* kDefaultPasses =
    "cse,fuse_qkv,fuse_rmsnorm_linear,fuse_router,fuse_linear_residual,fuse_moe_residual,dce";

} // namespace xserv::compiler
