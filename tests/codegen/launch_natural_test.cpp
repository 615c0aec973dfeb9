// A plan in the natural K order (compile --gemm-order natural) as its launch table runs it: for
// every step size, which kernels and library calls serve the dense linears, so that each is one
// chain over natural K (the decode kernels up to 8 tokens a step, cuBLAS pinned above), and the
// experts keep the canonical chains.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "codegen/cuda_lower.h"
#include "compiler/memory_plan.h"
#include "compiler/pass_manager.h"
#include "models/config.h"
#include "models/gpt_oss.h"
#include "runtime/executor.h"
#include "tests/test_util.h"

using namespace xserv;

namespace {

constexpr int64_t kSeqs = 64, kMaxSeq = 8192, kTokens = 2048;

/// The 120b's graph (the 20b's widths, 128 experts) after the default passes, lowered for a natural
/// plan of kSeqs sequences and steps of up to kTokens tokens.
runtime::LaunchTable natural_table(compiler::MemoryPlan& mem, int& layers) {
  const models::ModelConfig cfg =
      models::ModelConfig::load(testing::source_dir() / "examples/gpt-oss-120b/config.json");
  compiler::PassManager pm;
  pm.add_passes(compiler::kDefaultPasses);
  layers = int(cfg.num_hidden_layers);
  static const ir::Graph g = pm.run(models::build_gpt_oss(cfg, {}));
  mem = compiler::plan_memory(g, {{ir::dims::kTokens, kTokens},
                                  {ir::dims::kSeqs, kSeqs},
                                  {ir::dims::kTableBlocks, (kMaxSeq + 15) / 16}});
  codegen::LoweringContext ctx;
  ctx.max_tokens = int(kTokens);
  ctx.max_seqs = int(kSeqs);
  ctx.max_seq = kMaxSeq;
  ctx.gemm_split = false;
  ctx.wgmma = true;
  ctx.dense_cublas = true;
  ctx.expert_format = runtime::ExpertFormat::Mxfp4;
  ctx.canonical = ctx.natural = true;
  ctx.memory = &mem;
  codegen::KernelSet ks;
  return codegen::lower_graph(g, ks, ctx);
}

/// What a step of `tokens` tokens over `seqs` sequences runs: kernel names, and "library N x K
/// fixed R" for each library call.
std::vector<std::string> step_names(const runtime::LaunchTable& t, int tokens, int seqs) {
  std::vector<std::string> out;
  const runtime::Executor ex(t, runtime::placeholder_bindings(t));
  for (const runtime::LaunchRecord& r : ex.record({tokens, seqs, 100})) {
    if (r.kernel >= 0) {
      out.push_back(t.kernels.at(size_t(r.kernel)).name);
    } else if (r.library >= 0) {
      const runtime::PlanLibraryCall& c = t.library.at(size_t(r.library));
      out.push_back(fmt::format("library {} x {} fixed {}", c.n, c.k, c.fixed_rows));
    }
  }
  return out;
}

long count(const std::vector<std::string>& ns, const std::string& part) {
  return std::count_if(ns.begin(), ns.end(),
                       [&](const std::string& n) { return n.find(part) != std::string::npos; });
}

} // namespace

TEST_CASE("a natural plan's dense linears are one chain over natural K at every step size") {
  compiler::MemoryPlan mem;
  int layers = 0;
  const runtime::LaunchTable t = natural_table(mem, layers);
  // Every library call pinned at the largest step of its rows: tokens, or sequences (lm_head).
  for (const runtime::PlanLibraryCall& c : t.library)
    CHECK(c.fixed_rows == (c.n > 16384 ? kSeqs : kTokens));
  // Decode steps: the fused qkv and router kernels and the linears, chained in natural K.
  for (int tokens : {1, 3, 8}) {
    CAPTURE(tokens);
    const std::vector<std::string> ns = step_names(t, tokens, tokens);
    CHECK(count(ns, fmt::format("qkv_rope_decode_chain_k2880_q4096_k512_v512_t{}_c1x1_g2_w1_r12_",
                                tokens == 1 ? 1 : 8)) == layers);
    CHECK(count(ns, "rmsnorm_router_topk_chain_d2880_e128_k4_c1_natural") == layers);
    CHECK(count(ns, "linear_residual_k4096_n2880_t8_mma_g2_s1_r16_a16_natural") == layers);
    CHECK(count(ns, "linear_k2880_n201088_nobias_t8_mma_g2_s1_r4_a16_natural") == 1);
    CHECK(count(ns, "_chain") >= 4 * layers); // + the experts' canonical rows
    CHECK(count(ns, "library") == 0);
    CHECK(count(ns, "gemmwg_") == 0);
    CHECK(count(ns, "splitk") == 0);
  }
  // From 9 rows: cuBLAS pinned for every dense linear (its picks by step size keep the pinned
  // algorithm's sums), the activations in K order, bias and residual after the sums.
  for (int tokens : {9, 64, 512}) {
    CAPTURE(tokens);
    const std::vector<std::string> ns = step_names(t, tokens, 1);
    CHECK(count(ns, "gemm_act_k2880_norm_bf16_natural") == layers);
    CHECK(count(ns, "library 4096 x 2880 fixed 2048") == layers); // q
    CHECK(count(ns, "library 512 x 2880 fixed 2048") == 2 * layers);
    CHECK(count(ns, "library 2880 x 4096 fixed 2048") == layers);
    CHECK(count(ns, "library 128 x 2880 fixed 2048") == layers); // router
    CHECK(count(ns, "gemm_splitk_reduce") >= 5 * layers);
    CHECK(count(ns, "gemmwg_store_k2880_n") == 0); // no dense gemm_wg; the experts' grouped ones
    CHECK(count(ns, "gemmwg_store_residual") == 0);
    CHECK(count(ns, "splitk") == count(ns, "gemm_splitk_reduce"));
    CHECK(count(ns, "qkv_rope_decode") == 0);
  }
  // lm_head: the decode kernel up to 8 sequences, cuBLAS above.
  CHECK(count(step_names(t, 8, 8), "library 201088") == 0);
  CHECK(count(step_names(t, 9, 9), "library 201088 x 2880 fixed 64") == 1);
}
