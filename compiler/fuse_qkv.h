// Fusion of an attention block's input norm, q/k/v projections and rotary embedding.
#pragma once

#include "compiler/pass.h"

namespace xserv::compiler {

/// Rewrites, per attention block,
///   xn = rms_norm(x, ln) {eps}
///   q = rope_yarn(reshape(linear(xn, wq, bq)), pos); k likewise; v = reshape(linear(xn, wv, bv))
/// into one node read through extracts 0, 1, 2:
///   qkv_rope(x, ln, wq, bq, wk, bk, wv, bv, pos) {eps, head_dim, theta, factor, ...}
///       : (f32[T,H,D], f32[T,G,D], f32[T,G,D])
/// whose kernel normalises x on load, runs the three projections as one GEMM over the
/// concatenated weight rows (the op keeps the three checkpoint tensors as operands, so no
/// weight has to be rewritten: the kernel indexes them as one) and rotates q and k in the
/// epilogue. It fires only when the norm feeds exactly these three biased linears, each linear
/// and q/k reshape feeds only the next step, both ropes share positions and attributes, and k
/// and v have the same head count; q is the first rotated projection in node order.
///
/// The KV-cache write stays a separate kv_write after attention: attention must read the
/// cache as it was before this step, because in a sliding layer's ring cache (slots = window)
/// the step's own keys land on slots that still hold keys its earlier tokens need (position
/// p + window evicts position p). Writing in this epilogue would corrupt multi-token steps.
PassResult fuse_qkv(const ir::Graph& g, const PassOptions& opts);

} // namespace xserv::compiler
