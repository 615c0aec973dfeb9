// `xserv inspect`: what a plan holds and costs: stages, weights, KV cache, activation arena,
// the ops of its graph, and roofline floors for decode and prefill.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/model_source.h"
#include "cli/plan_file.h"
#include "cli/roofline.h"
#include "ir/graph.h"
#include "models/config.h"

namespace xserv::cli {
namespace fs = std::filesystem;

namespace {

double gb(double bytes) {
  return bytes / 1e9;
}

PlanFile read_plan(const fs::path& dir) {
  if (!fs::exists(dir / "plan.json"))
    throw UsageError(fmt::format("'{}' is not a plan directory (no plan.json)", dir.string()));
  PlanFile plan = read_plan_file(dir);
  verify_plan_files(plan);
  return plan;
}

} // namespace

int cmd_inspect(const ParsedArgs& args) {
  const fs::path dir = args.positional()[0];
  const PlanFile plan = read_plan(dir);
  const nlohmann::json& pj = plan.doc; // every field below was checked by read_plan_file
  const models::ModelConfig cfg =
      models::ModelConfig::from_json(plan.config, plan.file.string() + " (field 'config')");
  const ir::Graph g = read_graph(plan.graph_path(), "graph file");
  ir::verify_or_throw(g, "in " + plan.graph_path().string());

  const auto& opt = pj.at("options");
  const int64_t max_batch = plan.max_batch;
  const int64_t max_seq = plan.max_seq;
  const WeightBytes w = weight_bytes(cfg);
  // KV cache: full layers hold max_seq positions, sliding layers a ring of sliding_window.
  double kv_elem = 2;
  for (const auto& n : g.nodes)
    if (n.op == ir::Op::Cache)
      kv_elem = n.type().dtype == ir::DType::F32 ? 4 : 2;
  double kv = 0;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l)
    kv += static_cast<double>(cfg.is_sliding(l) ? std::min(cfg.sliding_window, max_seq) : max_seq) *
          static_cast<double>(cfg.kv_width()) * 2 * kv_elem * static_cast<double>(max_batch);
  const double arena = pj.contains("memory") ? pj["memory"].value("arena_bytes", 0.0) : 0.0;
  std::map<std::string, int> ops;
  for (const auto& n : g.nodes)
    ++ops[std::string(ir::op_name(n.op))];
  const DecodeEstimate d0 = decode_floor(cfg, 1, 0), d4k = decode_floor(cfg, 1, 4096);
  const DecodeEstimate b64 = decode_floor(cfg, std::min<int64_t>(64, max_batch), 0);
  const double pf = prefill_flops_per_token(cfg, 256);
  const Ceilings ceil;

  if (args.has("--json")) {
    nlohmann::json out = {
        {"plan", dir.string()},
        {"model_digest", pj.value("model_digest", "")},
        {"options", opt},
        {"stages", pj.contains("pipeline")
                       ? pj["pipeline"]["stages"]
                       : nlohmann::json::array({{{"stage", 0},
                                                 {"layers", {0, cfg.num_hidden_layers - 1}},
                                                 {"weight_bytes", w.total()},
                                                 {"kv_cache_bytes", kv},
                                                 {"activation_arena_bytes", arena}}})},
        {"imbalance", pj.contains("pipeline") ? pj["pipeline"].value("imbalance", 0.0) : 0.0},
        {"weights",
         {{"attention", w.attention},
          {"router", w.router},
          {"experts_bf16", w.experts},
          {"embed", w.embed},
          {"lm_head", w.lm_head},
          {"total", w.total()}}},
        {"graph", {{"nodes", g.size()}, {"ops", ops}}},
        {"kernels", pj.contains("codegen") ? pj["codegen"]["kernels"] : nlohmann::json::array()},
        {"launches_per_decode_step",
         pj.contains("codegen") ? pj["codegen"].value("launches_per_decode_step", 0) : 0},
        {"launches_per_prefill_step",
         pj.contains("codegen") ? pj["codegen"].value("launches_per_prefill_step", 0) : 0},
        {"roofline",
         {{"decode_b1_bytes", d0.bytes},
          {"decode_b1_tokens_per_s", d0.tokens_per_s},
          {"decode_b1_d4096_tokens_per_s", d4k.tokens_per_s},
          {"decode_batch", b64.tokens_per_s},
          {"prefill_flops_per_token", pf},
          {"prefill_tokens_per_s", ceil.flops_per_s / pf}}},
    };
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::string s;
  s += fmt::format("plan {}  ({})\n", dir.string(), pj.value("model_digest", "?"));
  s += fmt::format("model: {} layers ({} sliding, window {}), {} experts top-{}, hidden {}, "
                   "vocab {}\n",
                   cfg.num_hidden_layers, std::count(cfg.sliding.begin(), cfg.sliding.end(), true),
                   cfg.sliding_window, cfg.num_local_experts, cfg.num_experts_per_tok,
                   cfg.hidden_size, cfg.vocab_size);
  s += fmt::format("options: max batch {}, max sequence {}, prefill chunk {}, pp {}, arch {}\n\n",
                   max_batch, max_seq, opt.value("prefill_chunk", int64_t{0}),
                   opt.value("pp", int64_t{1}), opt.value("arch", std::string("?")));
  if (pj.contains("pipeline")) {
    // Each stage's program, its share of the weights and KV, and the cost model's estimate.
    s += "stage  layers      weights (BF16 experts)   KV cache     activations  decode est.  "
         "prefill est.\n";
    for (const auto& st : pj["pipeline"]["stages"]) {
      const auto& l = st["layers"];
      const std::string range = fmt::format("{}..{}{}{}", l[0].get<int>(), l[1].get<int>(),
                                            st.value("embedding", false) ? "+e" : "",
                                            st.value("head", false) ? "+h" : "");
      s += fmt::format(
          "{:<6} {:<10}  {:>10.2f} GB            {:>8.2f} GB  {:>8.1f} MB  {:>7.3f} ms"
          "   {:>6.2f} us/tok\n",
          st.value("stage", 0), range, gb(st.value("weight_bytes", 0.0)),
          gb(st.value("kv_cache_bytes", 0.0)), st.value("activation_arena_bytes", 0.0) / 1e6,
          st.value("estimated_decode_ms", 0.0), st.value("estimated_prefill_us_per_token", 0.0));
    }
    s += fmt::format("imbalance {:.1f}% (slowest stage over the mean; e = embedding, h = final "
                     "norm + lm_head)\n\n",
                     pj["pipeline"].value("imbalance", 0.0) * 100);
  } else {
    s += "stage  layers      weights (BF16 experts)   KV cache     activations\n";
    s += fmt::format("0      0..{:<8}  {:>10.2f} GB            {:>8.2f} GB  {:>8.1f} MB\n\n",
                     cfg.num_hidden_layers - 1, gb(w.total()), gb(kv), arena / 1e6);
  }
  s += fmt::format("weights: attention {:.2f} GB, router {:.3f} GB, experts {:.2f} GB, embed "
                   "{:.2f} GB, lm_head {:.2f} GB\n",
                   gb(w.attention), gb(w.router), gb(w.experts), gb(w.embed), gb(w.lm_head));
  s += fmt::format("graph: {} nodes;", g.size());
  for (const auto& [name, n] : ops)
    s += fmt::format(" {} {}", name, n);
  if (pj.contains("codegen")) {
    const auto& cg = pj["codegen"];
    s += fmt::format("\nkernels ({} for {}; launches: {} per decode step, {} per {}-token prefill "
                     "step):\n",
                     cg["kernels"].size(), cg.value("arch", "?"),
                     cg.value("launches_per_decode_step", 0),
                     cg.value("launches_per_prefill_step", 0), cg.value("prefill_step_tokens", 0));
    s += fmt::format("  {:<56} {:>5} {:>7} {:>7}\n", "kernel", "nodes", "decode", "prefill");
    for (const auto& k : cg["kernels"])
      s += fmt::format("  {:<56} {:>5} {:>7} {:>7}{}\n", k.value("name", "?"), k.value("nodes", 0),
                       k.value("decode_launches", 0), k.value("prefill_launches", 0),
                       k.contains("cubin") ? "" : "  (no cubin)");
    s += "\n";
  } else {
    s += "\nkernels: none in this plan\n\n";
  }
  s += fmt::format("roofline at {:.1f} TB/s and {:.0f} TFLOP/s:\n", ceil.bytes_per_s / 1e12,
                   ceil.flops_per_s / 1e12);
  s += fmt::format("  decode, batch 1, empty context: {:.2f} GB read, {:.3f} ms, {:.0f} tok/s\n",
                   gb(d0.bytes), d0.seconds * 1e3, d0.tokens_per_s);
  s += fmt::format("  decode, batch 1, 4096 context:  {:.2f} GB read, {:.3f} ms, {:.0f} tok/s\n",
                   gb(d4k.bytes), d4k.seconds * 1e3, d4k.tokens_per_s);
  s += fmt::format("  decode, batch {}:               {:.2f} GB read, {:.3f} ms, {:.0f} tok/s\n",
                   std::min<int64_t>(64, max_batch), gb(b64.bytes), b64.seconds * 1e3,
                   b64.tokens_per_s);
  s += fmt::format("  prefill: {:.2f} GFLOP per token, {:.0f} tok/s compute floor\n", pf / 1e9,
                   ceil.flops_per_s / pf);
  std::cout << s;
  return 0;
}

} // namespace xserv::cli
