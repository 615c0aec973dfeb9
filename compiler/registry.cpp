// The table of passes a pass list can name.
#include "compiler/cse.h"
#include "compiler/dce.h"
#include "compiler/fuse_linear_residual.h"
#include "compiler/fuse_moe_residual.h"
#include "compiler/fuse_qkv.h"
#include "compiler/fuse_rmsnorm_linear.h"
#include "compiler/fuse_router.h"
#include "compiler/pass.h"

namespace xserv::compiler {

const std::vector<PassInfo>& registered_passes() {
  static const std::vector<PassInfo> passes = {
      {"cse", "merge identical pure nodes", &cse},
      {"dce", "remove nodes that reach no output or state write", &dce},
      {"fuse_qkv", "attention input norm + q/k/v projections + rope -> qkv_rope", &fuse_qkv},
      {"fuse_rmsnorm_linear", "rms_norm read only by linears -> rms_norm_linear",
       &fuse_rmsnorm_linear},
      {"fuse_router", "router linear + router_topk -> router", &fuse_router},
      {"fuse_linear_residual", "add(h, linear) -> linear_residual", &fuse_linear_residual},
      {"fuse_moe_residual", "add(h, moe_experts) -> moe_experts_residual", &fuse_moe_residual},
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
