// The XSERV_* environment variables, read and checked in one place (docs/DESIGN.md,
// "Environment variables", lists them all): the commands pass what they read down as options:
// no layer below cli/ reads an XSERV_* variable.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "engine/pipeline/options.h"

namespace xserv::cli {

/// XSERV_PIPELINE_FAULT="RANK:WHAT@STEP", for the tests (engine/pipeline/options.h).
using PipelineFault = engine::pipeline::Fault;

/// Every XSERV_* setting the xserv binary reads. An unset or empty variable is its default.
struct Env {
  std::string data;         ///< XSERV_DATA: shared data directory (o200k_base.tiktoken, ...)
  std::string api_key;      ///< XSERV_API_KEY: serve's key when --api-key is not given
  std::string kernel_cache; ///< XSERV_KERNEL_CACHE: cubin cache directory
  int debug = 0;            ///< XSERV_DEBUG: 0-3, compile's pass log (1 timings, 2 IR, 3 CUDA)
  bool cuda_graphs = true;  ///< XSERV_CUDA_GRAPHS=0: decode steps launch eagerly
  bool profile = false;     ///< XSERV_PROFILE=1: time every launch-table entry (graphs off)
  bool pdl = true;          ///< XSERV_PDL=0: no programmatic dependent launch
  /// XSERV_PROFILE_REPEAT=NAME[:TIMES] (TIMES 2-16, default 2): launches of kernels whose name
  /// contains NAME go out TIMES times, for their in-graph cost (timing only).
  std::string profile_repeat;
  int profile_repeat_times = 2;
  /// XSERV_PREFILL_CHUNK: tokens per prefill sub-step, [8, 65536]; a run with it set lowers
  /// the graph itself instead of replaying the plan (graph mode, saying why).
  std::optional<int> prefill_chunk;
  /// XSERV_GEMM_PRECISION=split|bf16 (true: split); like prefill_chunk, it falls back to
  /// graph mode when it differs from the plan's.
  std::optional<bool> gemm_split;
  /// XSERV_PIPELINE_TIMEOUT (seconds, > 0, at least 0.1 is used): a silent rank is hung.
  std::chrono::milliseconds pipeline_timeout{10000};
  /// XSERV_PIPELINE_STEP_TIMEOUT (seconds, > 0, at least 0.1 is used): the longest wait for one
  /// rank's answer in a step, however many heartbeats come. 60 s: a GPU stage's largest step
  /// takes well under a second, its first a few (CUDA graphs); the CPU interpreter on a large
  /// model needs more, and says so by this variable's name when it runs out.
  std::chrono::milliseconds pipeline_step_timeout{60000};
  int pipeline_micro_batches = 0; ///< XSERV_PIPELINE_MICROBATCHES: >= 1; 0 (unset): default
  std::string pipeline_transport = "auto"; ///< XSERV_PIPELINE_TRANSPORT=auto|nccl|tcp
  /// XSERV_PIPELINE_TOKEN: the pipeline's shared secret when --pipeline-token is not given.
  /// Read once, like the others: a rank 0 hands its spawned workers the token in their own
  /// environment, and passes it within the process as a value (PipelineLaunch::token).
  std::string pipeline_token;
  std::optional<PipelineFault> pipeline_fault; ///< XSERV_PIPELINE_FAULT (tests only)
};

/// Parses the variables through `get` (getenv's contract: nullptr when unset). Throws UsageError
/// naming the variable, its value and what it accepts for a value it does not.
Env parse_env(const std::function<const char*(const char*)>& get);

/// The process's settings: parse_env(std::getenv) on the first call, the same object after.
const Env& env();

/// Where compiled kernels are cached: $XSERV_KERNEL_CACHE, else $XDG_CACHE_HOME/xserv/kernels,
/// else ~/.cache/xserv/kernels.
std::filesystem::path kernel_cache_dir();

} // namespace xserv::cli
