// Emits the CUDA source of the prompt attention kernel (codegen/kernels/attention_mma.cuh:
// attention_prefill_mma): many query tokens per step, a block per (kv head, tile of consecutive
// query tokens).
#pragma once

#include "codegen/emit.h"

#include <string>
#include <vector>

namespace xserv::codegen {

/// attention with sinks for prompt steps in the canonical order (d.chunk keys a chunk; fp16
/// operands, fp16 pairs with d.split), same semantics as emit_attention_decode (no key splits,
/// no combine kernel). Kernel parameters: q, k, v, k_cache, v_cache, sinks, positions,
/// token_seq, ctx_lens, cache_rows, out, tokens (int, the step's token count); grid (kv_heads,
/// ceil(tokens / (128 / (heads / kv_heads)))), 256 threads, no dynamic shared memory. Needs
/// heads / kv_heads to divide 128 and head_dim divisible by 16. Name prefix
/// "attention_prefill_mma".
KernelSource emit_attention_prefill_mma(const AttentionDims& d,
                                        const std::vector<std::string>& ir_lines);

} // namespace xserv::codegen
