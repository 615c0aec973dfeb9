// Fusion of the MoE router projection with its top-k selection.
#pragma once

#include "compiler/pass.h"

namespace xserv::compiler {

/// Rewrites router_topk(linear(x, W[, b])) {k} whose logits have no other reader into
/// router(x, W[, b]) {k} : (f32[T,k], i32[T,k]), keeping the two results (routing weights,
/// expert ids) that the existing extracts read. One kernel computes a token's E logits, picks
/// the top k and softmaxes them without writing the logits. The norm before the router stays
/// separate: its output also feeds moe_experts.
PassResult fuse_router(const ir::Graph& g, const PassOptions& opts);

} // namespace xserv::compiler
