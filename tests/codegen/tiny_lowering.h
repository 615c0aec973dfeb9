// The tiny config's graph after the default passes, lowered for `seqs` sequences as an sm_90
// plan with MXFP4 experts on tensor cores (launch tables for tests that record a step's
// launches without a GPU).
#pragma once

#include "codegen/cuda_lower.h"
#include "compiler/memory_plan.h"
#include "compiler/pass_manager.h"
#include "ir/dims.h"
#include "models/config.h"
#include "models/gpt_oss.h"
#include "tests/test_util.h"

namespace xserv::testing {

inline models::ModelConfig tiny_config() {
  return models::ModelConfig::load(source_dir() / "examples/tiny/config.json");
}

inline ir::Graph tiny_graph() {
  compiler::PassManager pm;
  pm.add_passes(compiler::kDefaultPasses);
  return pm.run(models::build_gpt_oss(tiny_config()));
}

/// `ctx`'s options (precision, cuBLAS, ...) with the capacities and the activation arena of
/// `seqs` sequences of up to `max_seq` positions and 512-token prompt chunks.
inline runtime::LaunchTable lower_tiny(const ir::Graph& g, codegen::LoweringContext ctx, int seqs,
                                       int64_t max_seq) {
  const int tokens = codegen::step_token_capacity(seqs, 512);
  const compiler::MemoryPlan mem =
      compiler::plan_memory(g, {{ir::dims::kTokens, tokens},
                                {ir::dims::kSeqs, seqs},
                                {ir::dims::kTableBlocks, (max_seq + 15) / 16}});
  ctx.max_tokens = tokens;
  ctx.max_seqs = seqs;
  ctx.max_seq = max_seq;
  ctx.wgmma = true;
  ctx.expert_format = runtime::ExpertFormat::Mxfp4;
  ctx.memory = &mem;
  codegen::KernelSet ks;
  return codegen::lower_graph(g, ks, ctx);
}

} // namespace xserv::testing
