// lower_stage(): memory plan, lowering and stage layout of one graph, as compile and the
// in-memory compile both run them.
#include "codegen/lower_stage.h"

#include "ir/dims.h"

namespace xserv::codegen {

LoweredStage lower_stage(const ir::Graph& g, const StageOptions& opts) {
  LoweredStage out;
  LoweringContext ctx;
  ctx.max_tokens = step_token_capacity(opts.max_batch, opts.prefill_chunk);
  ctx.max_seqs = static_cast<int>(opts.max_batch);
  ctx.max_seq = opts.max_seq;
  ctx.gemm_split = opts.gemm_split;
  ctx.expert_format = opts.expert_format;
  ctx.wgmma = opts.wgmma;
  ctx.dense_cublas = opts.dense_cublas;
  ctx.canonical = opts.canonical;
  ctx.natural = opts.canonical && opts.natural;
  ctx.mxfp4_small_scales = opts.mxfp4_small_scales;
  const int64_t block = ir::kv_block_of(g);
  out.memory =
      compiler::plan_memory(g, {{ir::dims::kTokens, ctx.max_tokens},
                                {ir::dims::kSeqs, opts.max_batch},
                                {ir::dims::kTableBlocks, (opts.max_seq + block - 1) / block}});
  if (opts.keep_activations) {
    int64_t end = 0;
    for (compiler::PlannedBuffer& b : out.memory.buffers) {
      b.offset = end;
      end += (b.bytes + 255) / 256 * 256;
    }
    out.memory.arena_bytes = end;
  }
  ctx.memory = &out.memory;
  if (opts.timeline)
    out.kernels.set_prelude("#define XSERV_TIMELINE 1 // a timeline plan (compile --timeline)\n");
  out.table = lower_graph(g, out.kernels, ctx);
  out.layout = stage_layout(g, ctx);
  return out;
}

} // namespace xserv::codegen
