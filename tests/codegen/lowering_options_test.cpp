// The lowering's two speed options, on by default (codegen::LoweringContext::moe_cols and
// lm_head_library): what each changes in a plain bf16 sm_90 plan's launch table (the tiny
// config: MXFP4 experts on tensor cores, the whole vocabulary) against both off, and that each
// alone changes only its own launches.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "runtime/executor.h"
#include "tests/codegen/tiny_lowering.h"

using namespace xserv;

namespace {

constexpr int kSeqs = 80; // decode steps past 64 sequences
constexpr int64_t kMaxSeq = 4096;

struct Options {
  bool moe_cols = false, lm_head_library = false;
};

runtime::LaunchTable lower_with(const ir::Graph& g, Options o) {
  codegen::LoweringContext ctx;
  ctx.gemm_split = false;
  ctx.dense_cublas = true;
  ctx.moe_cols = o.moe_cols;
  ctx.lm_head_library = o.lm_head_library;
  return testing::lower_tiny(g, ctx, kSeqs, kMaxSeq);
}

/// The launches of a decode step of `seqs` sequences, by kernel name ("library" for a call).
std::vector<std::string> decode_launches(const runtime::LaunchTable& t, int seqs) {
  const runtime::Executor ex(t, runtime::placeholder_bindings(t));
  std::vector<std::string> out;
  for (const runtime::LaunchRecord& r : ex.record({seqs, seqs, 100}))
    out.push_back(r.kernel >= 0 ? t.kernels.at(size_t(r.kernel)).name : "library");
  return out;
}

int count(const std::vector<std::string>& names, const std::string& part) {
  return int(std::count_if(names.begin(), names.end(), [&](const std::string& n) {
    return n.find(part) != std::string::npos;
  }));
}

} // namespace

TEST_CASE("lowering options: the MoE's tokens as columns from kMoeColsFrom to 8 tokens, lm_head "
          "as a library call above 64 sequences, nothing when off") {
  const ir::Graph g = testing::tiny_graph();
  const int layers = int(testing::tiny_config().num_hidden_layers);
  const runtime::LaunchTable plain = lower_with(g, {});
  const runtime::LaunchTable cols = lower_with(g, {true, false});
  const runtime::LaunchTable lm = lower_with(g, {false, true});
  // The defaults are both options on.
  const runtime::LaunchTable both = lower_with(g, {true, true});
  codegen::LoweringContext defaults;
  CHECK(defaults.moe_cols);
  CHECK(defaults.lm_head_library);
  for (int seqs : {1, 2, codegen::kMoeColsFrom - 1, codegen::kMoeColsFrom, 8, 9, 64, 65, kSeqs}) {
    CAPTURE(seqs);
    const auto p = decode_launches(plain, seqs), c = decode_launches(cols, seqs),
               l = decode_launches(lm, seqs);
    CHECK(count(p, "_cols") == 0);
    CHECK(count(l, "_cols") == 0);
    // gate_up and down of every layer, from 2 to 8 tokens, in place of the per-pair kernels
    const bool columns = seqs >= codegen::kMoeColsFrom && seqs <= 8;
    CHECK(count(c, "_cols") == (columns ? 2 * layers : 0));
    CHECK(c.size() == p.size());
    CHECK(count(decode_launches(both, seqs), "_cols") == count(c, "_cols"));
    CHECK(count(decode_launches(both, seqs), "library") == count(l, "library"));
    // lm_head: one library call (its sums are the logits: no reduce after it) above 64 rows
    const int calls = count(p, "library");
    CHECK(count(l, "library") == calls + (seqs > 64 ? 1 : 0));
    CHECK(count(l, "gemmwg_store_k64_n201088") == (seqs > 64 ? 0 : count(p, "n201088_t64")));
    if (seqs > 64) { // gemm_act in K order and the call, for gemm_act and the gemm
      CHECK(count(p, "gemmwg_store_k64_n201088") == 1);
      CHECK(l.size() == p.size());
    } else {
      CHECK(l == p);
    }
  }
}
