// `xserv worker`: one rank of a pipelined plan, serving the rank 0 that `xserv run` started.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/model_source.h"
#include "engine/pipeline/worker.h"

namespace xserv::cli {

int cmd_worker(const ParsedArgs& args) {
  for (const char* required : {"--rank", "--world", "--coordinator"})
    if (!args.has(required))
      throw UsageError(fmt::format("worker needs {}", required));
  if (args.has("--device")) {
    // Before any CUDA call: this process sees only its GPU (an index into the GPUs already
    // visible, so CUDA_VISIBLE_DEVICES=2,3 with --device 1 means GPU 3).
    const int64_t d = args.get_int("--device", 0, 0, 1023);
    std::vector<std::string> visible;
    if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v && *v) {
      std::string list = v;
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        visible.push_back(list.substr(at, comma - at));
        at = comma + 1;
      }
    }
    if (!visible.empty() && d >= static_cast<int64_t>(visible.size()))
      throw UsageError(
          fmt::format("--device {} but CUDA_VISIBLE_DEVICES lists {} GPU(s)", d, visible.size()));
    const std::string pick = visible.empty() ? std::to_string(d) : visible[size_t(d)];
    ::setenv("CUDA_VISIBLE_DEVICES", pick.c_str(), 1);
  }
  const ModelSource src = resolve_source(args.positional()[0], args);
  if (!src.plan || !src.plan->plan->pipelined())
    throw UsageError(fmt::format("'{}' is not a plan compiled with --pp N", args.positional()[0]));
  const int rank = static_cast<int>(args.get_int("--rank", 0, 0, 1 << 16));
  const int world = static_cast<int>(args.get_int("--world", 0, 1, 1 << 16));
  engine::pipeline::PipelineOptions options = pipeline_options(args);
  if (options.token.empty()) // a usage mistake (exit 2), said before anything connects
    throw UsageError("no pipeline token: neither --pipeline-token nor XSERV_PIPELINE_TOKEN is "
                     "set; give every rank the same secret as rank 0");
  try {
    return engine::pipeline::run_worker(*src.plan, rank, world, options, cuda_model_options(),
                                        run_settings());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "xserv worker (rank %d): error: %s\n", rank, e.what());
    return 1;
  }
}

} // namespace xserv::cli
