// How a CUDA model runs its program: the switches its caller reads from the environment. A
// header of its own so that the layers above pass them on without seeing the CUDA model.
#pragma once

#include <filesystem>
#include <string>

namespace xserv::engine {

/// How a CudaModel runs its program. The command line fills it from the environment
/// (XSERV_KERNEL_CACHE, XSERV_CUDA_GRAPHS, XSERV_PROFILE, XSERV_PDL).
struct CudaModelOptions {
  /// Cubin cache for the kernels the weight upload compiles (MXFP4 dequantisation); required.
  std::filesystem::path cache_dir;
  bool quiet = false; ///< no "[cuda] ..." progress lines on stderr
  /// Decode sub-steps (one token per sequence) run as CUDA graphs, captured once per (batch
  /// size, attention key bucket) and replayed; off: every launch goes out eagerly.
  bool cuda_graphs = true;
  /// With cuda_graphs: capture the graph of every decode shape (batch 1..max_batch x attention
  /// key buckets up to max_seq) when the model loads, so no request waits for a capture.
  bool capture_at_start = true;
  /// Kernels launch with programmatic dependent launch on sm_90 and newer (each grid is
  /// scheduled while the previous one drains; every generated kernel first waits for it).
  bool dependent_launch = true;
  /// Every launch table entry timed with CUDA events (graphs off), summed per (phase, op) and
  /// printed when the model closes.
  bool profile = false;
  /// runtime::DeviceStageOptions::repeat_kernel / repeat_times (XSERV_PROFILE_REPEAT).
  std::string repeat_kernel;
  int repeat_times = 2;
  /// The KV pools (models::KvGeometry): `kv_blocks` full-attention blocks when given, else a
  /// pool of `kv_memory` bytes, else what gpu_memory_utilization of the GPU leaves after what is
  /// in use (vLLM's rule; the command line's default is 0.9); the sliding-window pool
  /// `window_blocks`, else twice the windows of max_batch sequences and a prompt chunk's. All
  /// zero: max_batch fixed rows of max_seq positions (tests and benchmarks that place
  /// sequences themselves, models::row_tables).
  int64_t kv_blocks = 0, window_blocks = 0;
  uint64_t kv_memory = 0;
  double gpu_memory_utilization = 0;
};

} // namespace xserv::engine
