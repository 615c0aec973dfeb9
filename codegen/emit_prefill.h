// Emits the CUDA source of the prefill attention kernel (codegen/kernels/attention_prefill.cuh):
// many query tokens per step, a block per (kv head, tile of consecutive query tokens).
#pragma once

#include "codegen/emit.h"

#include <string>
#include <vector>

namespace xserv::codegen {

/// attention with sinks for prefill steps, same semantics as emit_attention_decode (no key
/// splits, no combine kernel). Kernel parameters: q, k, v, k_cache, v_cache, sinks, positions,
/// token_seq, ctx_lens, cache_rows, out, tokens (int, the step's token count); grid (kv_heads,
/// ceil(tokens / (128 / (heads / kv_heads)))), 256 threads, launch.smem_fixed bytes of dynamic
/// shared memory (105,472 for head_dim 64). Needs heads / kv_heads to divide 128 and head_dim
/// divisible by 16.
KernelSource emit_attention_prefill(const AttentionDims& d,
                                    const std::vector<std::string>& ir_lines);

/// The same attention on tensor cores (codegen/kernels/attention_mma.cuh: fp16 operands, fp32
/// accumulation and softmax), for plans with plain bf16 gemm activations. Same parameters, grid
/// and conditions; no dynamic shared memory. Name prefix "attention_prefill_mma".
KernelSource emit_attention_prefill_mma(const AttentionDims& d,
                                        const std::vector<std::string>& ir_lines);

/// Dynamic shared memory bytes of the prefill attention kernel for `head_dim` (mirrors
/// attention_prefill_smem_bytes in attention_prefill.cuh).
size_t attention_prefill_smem_bytes(int head_dim);

} // namespace xserv::codegen
