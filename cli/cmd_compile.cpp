// `xserv compile`: the flags checked and handed to driver::compile_plan(), the IR printed with
// --emit ir.
#include <cctype>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/env.h"
#include "driver/compile_plan.h"
#include "runtime/plan_file.h"

namespace xserv::cli {
namespace fs = std::filesystem;

namespace {

/// --arch: "sm_" and a number, optionally a feature letter ("sm_90a").
std::string arch_flag(const ParsedArgs& args) {
  const std::string arch = args.get("--arch", "sm_90");
  const size_t digits = arch.find_first_not_of("0123456789", 3);
  if (arch.rfind("sm_", 0) != 0 || arch.size() < 4 || digits == 3 ||
      (digits != std::string::npos &&
       (digits + 1 != arch.size() || !std::islower(static_cast<unsigned char>(arch[digits])))))
    throw UsageError(fmt::format("--arch must be a GPU architecture like sm_90, got '{}'", arch));
  return arch;
}

} // namespace

int cmd_compile(const ParsedArgs& args) {
  driver::CompileOptions o;
  o.model = args.positional()[0];
  if (!fs::exists(o.model))
    throw UsageError(fmt::format("model directory '{}' does not exist", o.model.string()));
  if (!fs::exists(fs::is_directory(o.model) ? o.model / "config.json" : o.model))
    throw UsageError(fmt::format("'{}' holds no config.json", o.model.string()));
  const std::string emit = args.get("--emit", "plan");
  if (emit != "ir" && emit != "plan")
    throw UsageError(fmt::format("--emit must be 'ir' or 'plan', got '{}'", emit));
  if (emit == "plan" && !args.has("-o"))
    throw UsageError("missing -o PLAN_DIR (or use --emit ir to print the IR)");
  if (emit == "plan")
    o.output = args.get("-o");
  o.max_batch = args.get_int("--max-batch", 256, 1, runtime::kPlanMaxBatch);
  o.max_seq = args.get_int("--max-seq", 8192, 1, runtime::kPlanMaxSeq);
  o.prefill_chunk =
      args.get_int("--prefill-chunk", std::min<int64_t>(2048, o.max_seq), 1, int64_t{1} << 20);
  o.kv_block = args.get_int("--kv-block", 16, 1, 1024);
  if ((o.kv_block & (o.kv_block - 1)) != 0)
    throw UsageError(fmt::format("--kv-block must be a power of two, got {}", o.kv_block));
  o.arch = arch_flag(args);
  // The defaults (docs/PERF.md, "Compile options"): MXFP4 experts win decode
  // and batched decode for a few percent of prefill and hold 40% less memory; plain bf16 gemm
  // activations are 1.6-1.7x the split ones in prefill.
  const std::string experts = args.get("--expert-format", "mxfp4");
  if (!runtime::parse_expert_format(experts, o.expert_format))
    throw UsageError(fmt::format("--expert-format must be bf16, mxfp4 or both, got '{}'", experts));
  const std::string precision = args.get("--gemm-precision", "bf16");
  if (precision != "split" && precision != "bf16")
    throw UsageError(fmt::format("--gemm-precision must be split or bf16, got '{}'", precision));
  o.gemm_split = precision == "split";
  // cuBLAS for the dense projections of prompt steps wherever it can serve them (plain bf16
  // activations on sm_90; docs/PERF.md, "Compile options").
  if (args.has("--dense-gemm")) {
    const std::string dense = args.get("--dense-gemm");
    if (dense != "wg" && dense != "cublas")
      throw UsageError(fmt::format("--dense-gemm must be wg or cublas, got '{}'", dense));
    if (dense == "cublas" && (o.gemm_split || o.arch != "sm_90"))
      throw UsageError("--dense-gemm cublas needs --gemm-precision bf16 and an sm_90 plan");
    o.dense_cublas = dense == "cublas";
  }
  const std::string order = args.get("--gemm-order", "fast");
  if (order != "fast" && order != "canonical" && order != "natural")
    throw UsageError(
        fmt::format("--gemm-order must be fast, canonical or natural, got '{}'", order));
  o.gemm_canonical = order != "fast";
  o.gemm_natural = order == "natural";
  if (order == "canonical" && o.dense_cublas.value_or(false))
    throw UsageError("--gemm-order canonical takes gemm_wg's projections: not --dense-gemm cublas");
  // Split activations (hi + lo pairs) have no decode kernels in the canonical order: such a plan
  // would order only its attention (inspect's "batch invariance" line), so it is refused.
  if (order == "canonical" && (o.gemm_split || o.arch != "sm_90"))
    throw UsageError("--gemm-order canonical needs --gemm-precision bf16 and an sm_90 plan (split "
                     "activations' decode kernels sum in the step's order)");
  if (o.gemm_natural && (o.gemm_split || o.arch != "sm_90" || !o.dense_cublas.value_or(true)))
    throw UsageError("--gemm-order natural needs --gemm-precision bf16, an sm_90 plan and cuBLAS's "
                     "projections (not --dense-gemm wg)");
  const std::string kv = args.get("--kv-dtype", "f32");
  if (kv != "f32" && kv != "bf16")
    throw UsageError(fmt::format("--kv-dtype must be f32 or bf16, got '{}'", kv));
  o.kv_dtype = kv == "f32" ? ir::DType::F32 : ir::DType::BF16;
  o.all_logits = args.has("--all-logits");
  o.pp = static_cast<int>(args.get_int("--pp", 1, 1, runtime::kPlanMaxStages));
  o.passes = args.get("--passes", "");
  o.dump_after = args.list("--dump-after");
  o.verify_after_all = args.has("--verify-after-all");
  o.stop_after = static_cast<int>(args.get_int("--stop-after", -1, 0, 1000));
  if (args.has("--dump-dir"))
    o.dump_dir = args.get("--dump-dir");
  o.debug = env().debug;
  o.cubins = !args.has("--no-cubins");
  o.timeline = args.has("--timeline");
  o.kernel_cache = kernel_cache_dir();

  const driver::CompileResult r = driver::compile_plan(o);
  if (emit == "ir")
    std::cout << ir::print(r.graph);
  else
    std::fprintf(stderr, "[compile] done in %.1f ms\n", r.total_ms);
  return 0;
}

} // namespace xserv::cli
