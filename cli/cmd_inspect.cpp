// `xserv inspect`: what a plan holds and costs: stages, weights, KV cache, activation arena,
// the ops of its graph, and roofline floors for decode and prefill. It reads the plan through
// runtime::read_plan, like run.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/model_source.h"
#include "engine/roofline.h"
#include "ir/graph.h"
#include "models/config.h"
#include "runtime/device.h"
#include "runtime/plan_io.h"

namespace xserv::cli {
namespace fs = std::filesystem;

namespace {

double gb(double bytes) {
  return bytes / 1e9;
}

runtime::Plan read_checked_plan(const fs::path& dir) {
  if (!fs::exists(dir / "plan.json"))
    throw UsageError(fmt::format("'{}' is not a plan directory (no plan.json)", dir.string()));
  runtime::Plan plan = runtime::read_plan(dir);
  runtime::verify_plan_files(dir, plan);
  return plan;
}

nlohmann::json names(const std::vector<runtime::PlanTransfer>& ts) {
  nlohmann::json out = nlohmann::json::array();
  for (const runtime::PlanTransfer& t : ts)
    out.push_back(t.name);
  return out;
}

} // namespace

int cmd_inspect(const ParsedArgs& args) {
  const fs::path dir = args.positional()[0];
  const runtime::Plan plan = read_checked_plan(dir);
  const std::string file = (dir / "plan.json").string();
  const models::ModelConfig cfg =
      models::ModelConfig::from_json(plan.config, file + " (field 'config')");
  // The graph is for display only: run may work without it (it can be deleted).
  std::optional<ir::Graph> g;
  if (fs::exists(dir / plan.graph)) {
    g = ir::parse_file(dir / plan.graph, "graph file");
    ir::verify_or_throw(*g, "in " + (dir / plan.graph).string());
  }
  const runtime::PlanOptions& opt = plan.options;
  const int64_t max_batch = opt.max_batch;
  const int64_t max_seq = opt.max_seq;
  const engine::WeightBytes w = engine::weight_bytes(cfg, opt.expert_format);
  // The KV pools: a position's bytes in the full-attention and the sliding-window pool (keys and
  // values of those layers); how many blocks they hold is decided when the model loads.
  const double kv_elem = opt.kv_dtype == runtime::KvDtype::F32 ? 4 : 2;
  double full_pos = 0, window_pos = 0;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l)
    (cfg.is_sliding(l) ? window_pos : full_pos) +=
        static_cast<double>(cfg.kv_width()) * 2 * kv_elem;
  const int64_t kv_block = plan.stages.front().layout.kv_block;
  const double arena = static_cast<double>(plan.memory.arena_bytes);
  // What the default --gpu-memory-utilization (0.9) leaves the full pool on this machine's GPU,
  // after the weights, the arena, 1 GiB of workspaces and the window pool.
  const runtime::DeviceInfo dev = runtime::probe_device();
  const double ring = std::ceil(double(cfg.sliding_window) / double(kv_block)) + 1;
  const double window_pool =
      window_pos * double(kv_block) *
      (2 * double(max_batch) * ring + double(opt.prefill_chunk) / double(kv_block));
  const double kv_capacity =
      dev.available ? std::max(0.0, double(dev.memory_bytes) * 0.9 - double(w.total()) - arena -
                                        double(1ull << 30) - window_pool) /
                          std::max(full_pos, 1.0)
                    : 0;
  std::map<std::string, int> ops;
  if (g)
    for (const auto& n : g->nodes)
      ++ops[std::string(ir::op_name(n.op))];
  const engine::DecodeEstimate d0 = engine::decode_floor(cfg, 1, 0, {}, opt.expert_format),
                               d4k = engine::decode_floor(cfg, 1, 4096, {}, opt.expert_format);
  const engine::DecodeEstimate b64 =
      engine::decode_floor(cfg, std::min<int64_t>(64, max_batch), 0, {}, opt.expert_format);
  const double pf = engine::prefill_flops_per_token(cfg, 256);
  const engine::Ceilings ceil;

  // Which of a step's sums keep one order whatever shares the step (issue: batch invariance by
  // default): attention does when its launches split by key chunks (the canonical order of
  // attention_mma.cuh); the experts when every MoE decode kernel is a canonical one (its name
  // ends in _chain: gemm_wg's order, Mx4ChainRows); the dense linears when the plan is canonical
  // (no library call, or in the natural order: cuBLAS pinned) and no decode GEMV of theirs is
  // outside that order (qkv and the router
  // fused in their chained kernels, qkv_rope_decode_chain and rmsnorm_router_topk_chain, or on
  // the gemms; the other linears' decode kernels chained).
  int attention_chunk = 0;
  for (const runtime::PlanStage& st : plan.stages)
    for (const runtime::PlanLaunch& l : st.table.launches)
      attention_chunk = std::max(attention_chunk, l.split_chunk);
  bool experts_canonical = false;
  for (const runtime::PlanKernelFile& k : plan.codegen.kernels)
    if (k.name.starts_with("moe_gate_up") || k.name.starts_with("moe_down")) {
      experts_canonical = k.name.ends_with("_chain");
      if (!experts_canonical)
        break;
    }
  bool linears_canonical = opt.gemm_canonical && (!opt.dense_cublas || opt.gemm_natural);
  for (const runtime::PlanStage& st : plan.stages) // natural: every library call pinned
    for (const runtime::PlanLibraryCall& c : st.table.library)
      if (c.fixed_rows <= 0)
        linears_canonical = false;
  for (const runtime::PlanKernelFile& k : plan.codegen.kernels)
    if (((k.name.starts_with("qkv") || k.name.starts_with("rmsnorm_router_topk")) &&
         k.name.find("_chain_") == std::string::npos) ||
        k.name.starts_with("rmsnorm_linear") ||
        (k.name.starts_with("linear") && !k.name.ends_with("_chain") &&
         !(opt.gemm_natural && k.name.ends_with("_natural"))))
      linears_canonical = false;

  if (args.has("--json")) {
    nlohmann::json stages = nlohmann::json::array();
    for (size_t i = 0; i < plan.stages.size(); ++i) {
      const runtime::PlanStage& st = plan.stages[i];
      nlohmann::json j = {{"stage", i},
                          {"graph", st.graph},
                          {"layers", {st.first_layer, st.last_layer}},
                          {"embedding", st.embedding},
                          {"head", st.head},
                          {"sends", names(st.sends)},
                          {"recvs", names(st.recvs)},
                          {"launches_per_decode_step", st.launches_per_decode_step},
                          {"launch_table_entries", st.table.launches.size()},
                          {"masked_pick", !st.table.masked_pick.empty()},
                          {"arena_bytes", st.layout.arena_bytes},
                          {"activation_arena_bytes", st.activation_arena_bytes}};
      if (plan.pipelined()) {
        j["weight_bytes"] = st.weight_bytes;
        j["kv_bytes_per_position"] = double(st.kv_cache_bytes) / double(kv_block);
        j["estimated_decode_ms"] = st.estimated_decode_ms;
        j["estimated_prefill_us_per_token"] = st.estimated_prefill_us_per_token;
      } else {
        j["weight_bytes"] = w.total();
        j["kv_bytes_per_position"] = full_pos + window_pos;
      }
      stages.push_back(std::move(j));
    }
    nlohmann::json kernels = nlohmann::json::array();
    for (const runtime::PlanKernelFile& k : plan.codegen.kernels)
      kernels.push_back({{"name", k.name},
                         {"nodes", k.nodes},
                         {"decode_launches", k.decode_launches},
                         {"prefill_launches", k.prefill_launches},
                         {"cubin", k.cubin}});
    nlohmann::json out = {
        {"plan", dir.string()},
        {"model_digest", plan.model_digest},
        {"options", runtime::plan_options_to_json(opt)},
        {"batch_invariance",
         {{"attention", attention_chunk > 0},
          {"attention_chunk_keys", attention_chunk},
          {"experts", experts_canonical},
          {"linears", linears_canonical}}},
        {"stages", std::move(stages)},
        {"imbalance", plan.imbalance},
        {"weights",
         {{"attention", w.attention},
          {"router", w.router},
          {"experts", w.experts}, // in the plan's format (options.expert_format)
          {"embed", w.embed},
          {"lm_head", w.lm_head},
          {"total", w.total()}}},
        {"kv_pool",
         {{"block_positions", kv_block},
          {"full_bytes_per_position", full_pos},
          {"window_bytes_per_position", window_pos},
          {"window", cfg.sliding_window},
          {"capacity_tokens_at_0_9",
           dev.available ? nlohmann::json(int64_t(kv_capacity)) : nlohmann::json()}}},
        {"graph", g ? nlohmann::json{{"nodes", g->size()}, {"ops", ops}} : nlohmann::json()},
        {"kernels", std::move(kernels)},
        {"launches_per_decode_step", plan.codegen.launches_per_decode_step},
        {"launches_per_prefill_step", plan.codegen.launches_per_prefill_step},
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
  s += fmt::format("plan {}  ({})\n", dir.string(), plan.model_digest);
  s += fmt::format("model: {} layers ({} sliding, window {}), {} experts top-{}, hidden {}, "
                   "vocab {}\n",
                   cfg.num_hidden_layers, std::count(cfg.sliding.begin(), cfg.sliding.end(), true),
                   cfg.sliding_window, cfg.num_local_experts, cfg.num_experts_per_tok,
                   cfg.hidden_size, cfg.vocab_size);
  s += fmt::format(
      "options: max batch {}, max sequence {}, prefill chunk {}, pp {}, arch {}, "
      "kv {}, gemm {}, experts {}{}{}{}{}\n\n",
      max_batch, max_seq, opt.prefill_chunk, opt.pp, opt.arch, runtime::kv_dtype_name(opt.kv_dtype),
      opt.gemm_split ? "split" : "bf16", runtime::expert_format_name(opt.expert_format),
      opt.mxfp4_max_scale >= 0
          ? fmt::format(" (MXFP4 scales up to {}: one multiply a pair)", opt.mxfp4_max_scale)
          : std::string(),
      opt.dense_cublas ? ", dense gemms of prompt steps on cuBLAS" : "",
      opt.gemm_natural     ? ", decode kernels in the gemms' canonical order (dense "
                             "linears in the natural K order, cuBLAS pinned)"
      : opt.gemm_canonical ? ", decode kernels in the gemms' canonical order"
                           : "",
      opt.timeline ? ", timeline stamps in every kernel (diagnostic)" : "");
  if (plan.pipelined()) {
    // Each stage's program, its share of the weights and KV, the cost model's estimate, and
    // the launch table the CUDA runtime replays for it.
    // The partitioner's cost model counts BF16 experts (its balance is the same either way).
    s += "stage  layers      weights (BF16 experts)   KV/position  activations  decode est.  "
         "prefill est.  launches\n";
    for (size_t i = 0; i < plan.stages.size(); ++i) {
      const runtime::PlanStage& st = plan.stages[i];
      const std::string range = fmt::format("{}..{}{}{}", st.first_layer, st.last_layer,
                                            st.embedding ? "+e" : "", st.head ? "+h" : "");
      s += fmt::format("{:<6} {:<10}  {:>10.2f} GB           {:>7.1f} KiB  {:>8.1f} MB  {:>7.3f} ms"
                       "   {:>6.2f} us/tok  {:>8}\n",
                       i, range, gb(double(st.weight_bytes)),
                       double(st.kv_cache_bytes) / double(kv_block) / 1024.0,
                       double(st.activation_arena_bytes) / 1e6, st.estimated_decode_ms,
                       st.estimated_prefill_us_per_token, st.launches_per_decode_step);
    }
    s += fmt::format("imbalance {:.1f}% (slowest stage over the mean; e = embedding, h = final "
                     "norm + lm_head; launches per decode step)\n\n",
                     plan.imbalance * 100);
  } else {
    s += fmt::format("stage  layers      weights ({} experts)  KV/position  activations\n",
                     opt.expert_format == runtime::ExpertFormat::Mxfp4  ? "MXFP4"
                     : opt.expert_format == runtime::ExpertFormat::Both ? "both "
                                                                        : "BF16 ");
    s += fmt::format("0      0..{:<8}  {:>10.2f} GB           {:>7.1f} KiB  {:>8.1f} MB\n\n",
                     cfg.num_hidden_layers - 1, gb(w.total()), (full_pos + window_pos) / 1024.0,
                     arena / 1e6);
  }
  s += fmt::format("KV pool: blocks of {} positions, paged; a position takes {:.1f} KiB in the "
                   "full-attention pool",
                   kv_block, full_pos / 1024.0);
  if (window_pos > 0)
    s += fmt::format(" and {:.1f} KiB in the sliding-window pool (window {}: a sequence holds at "
                     "most {} of its blocks)",
                     window_pos / 1024.0, cfg.sliding_window, int64_t(ring));
  s += fmt::format(". The pools are sized when the model loads (--gpu-memory-utilization, "
                   "--kv-memory); max batch {} bounds a step, not the sequences the pool holds",
                   max_batch);
  if (dev.available)
    s += fmt::format("; at 0.9 of this {} ({:.0f} GiB): about {} tokens, {} sequences of {}",
                     dev.name, double(dev.memory_bytes) / double(1ull << 30), int64_t(kv_capacity),
                     int64_t(kv_capacity) / std::max<int64_t>(max_seq, 1), max_seq);
  s += "\n";
  s += fmt::format("weights: attention {:.2f} GB, router {:.3f} GB, experts {:.2f} GB, embed "
                   "{:.2f} GB, lm_head {:.2f} GB\n",
                   gb(w.attention), gb(w.router), gb(w.experts), gb(w.embed), gb(w.lm_head));
  if (attention_chunk > 0 && experts_canonical && linears_canonical) {
    s += fmt::format("batch invariance: the whole step, attention (key chunks of {}), the experts "
                     "and the linears ({}), in one order for every step (the same bits alone or "
                     "batched, decode or prompt)\n",
                     attention_chunk,
                     opt.gemm_natural ? "the natural K order: cuBLAS's fixed order and the decode "
                                        "kernels"
                                      : "gemm_wg's K order in every kernel");
  } else if (attention_chunk > 0 || experts_canonical) {
    std::vector<std::string> parts;
    if (attention_chunk > 0)
      parts.push_back(fmt::format("attention (key chunks of {})", attention_chunk));
    if (experts_canonical)
      parts.push_back("the experts (gemm_wg's K order in every kernel)");
    s += fmt::format("batch invariance: {} in one order for every step (the same bits alone or "
                     "batched, decode or prompt); {} not yet (their sums follow the step's "
                     "size)\n",
                     fmt::join(parts, " and "),
                     experts_canonical ? "the dense linears" : "the linears and experts");
  } else {
    s += "batch invariance: none (a token's sums follow the step's size)\n";
  }
  if (g) {
    s += fmt::format("graph: {} nodes;", g->size());
    for (const auto& [name, n] : ops)
      s += fmt::format(" {} {}", name, n);
  } else {
    s += fmt::format("graph: {} is not in the plan directory (run does not need it)", plan.graph);
  }
  const runtime::PlanCodegen& cg = plan.codegen;
  s += fmt::format("\nkernels ({} for {}; launches: {} per decode step, {} per {}-token prefill "
                   "step):\n",
                   cg.kernels.size(), cg.arch, cg.launches_per_decode_step,
                   cg.launches_per_prefill_step, cg.prefill_step_tokens);
  s += fmt::format("  {:<56} {:>5} {:>7} {:>7}\n", "kernel", "nodes", "decode", "prefill");
  for (const runtime::PlanKernelFile& k : cg.kernels) {
    // Structured output's masked pick runs outside the steps, after one with constrained rows.
    const bool masked_pick = k.name.rfind("argmax_masked_rows", 0) == 0;
    s += fmt::format("  {:<56} {:>5} {:>7} {:>7}{}{}\n", k.name, k.nodes, k.decode_launches,
                     k.prefill_launches, k.cubin ? "" : "  (no cubin)",
                     masked_pick ? "  (after a step with constrained rows)" : "");
  }
  s += "\n";
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
