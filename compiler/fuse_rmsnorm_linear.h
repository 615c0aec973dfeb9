// Fusion of rms_norm into the linears that read it.
#pragma once

#include "compiler/pass.h"

namespace xserv::compiler {

/// Rewrites rms_norm(x, ln) {eps} whose every reader is a linear taking it as input x into one
/// rms_norm_linear(x, ln, W[, b]) {eps} per linear: the matmul normalises each input row as it
/// loads it, so the normalised activations never go to memory. A norm with any other reader
/// (moe_experts, a residual add, an output) is left alone, as are its linears. Run fuse_qkv
/// first: it claims the attention norm with its q/k/v projections as a whole.
PassResult fuse_rmsnorm_linear(const ir::Graph& g, const PassOptions& opts);

} // namespace xserv::compiler
