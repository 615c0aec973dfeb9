// `xserv worker`: one rank of a pipelined plan, serving the rank 0 that `xserv run` started.
#include <cstdio>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/model_source.h"
#include "cli/pipeline_cpu.h"

namespace xserv::cli {

int cmd_worker(const ParsedArgs& args) {
  for (const char* required : {"--rank", "--world", "--coordinator"})
    if (!args.has(required))
      throw UsageError(fmt::format("worker needs {}", required));
  const ModelSource src = resolve_source(args.positional()[0], args);
  if (src.plan_dir.empty() || src.stage_graphs.empty())
    throw UsageError(fmt::format("'{}' is not a plan compiled with --pp N", args.positional()[0]));
  const int rank = static_cast<int>(args.get_int("--rank", 0, 0, 1 << 16));
  const int world = static_cast<int>(args.get_int("--world", 0, 1, 1 << 16));
  try {
    return run_pipeline_worker(src.plan_dir, src.model_dir, rank, world, args.get("--coordinator"));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "xserv worker (rank %d): error: %s\n", rank, e.what());
    return 1;
  }
}

} // namespace xserv::cli
