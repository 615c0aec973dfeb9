// Fusion of the residual add into the mixture-of-experts combine.
#pragma once

#include "compiler/pass.h"

namespace xserv::compiler {

/// Rewrites add(h, moe_experts(x, w, ids, gate_up, gate_up_b, down, down_b)) {limit, alpha}
/// (either operand order) whose moe_experts has no other reader into
/// moe_experts_residual(x, w, ids, gate_up, gate_up_b, down, down_b, h) {limit, alpha}. The
/// experts' kernels already fuse gate_up + clamped SwiGLU and down + bias + routing weight;
/// their combine step now also adds the residual stream. When both operands qualify, the
/// second is fused.
PassResult fuse_moe_residual(const ir::Graph& g, const PassOptions& opts);

} // namespace xserv::compiler
