// Writing synthetic gpt-oss checkpoints (random weights in the HF MXFP4 layout) of any size.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "models/config.h"

namespace xserv::models {

/// Sizes and distributions of a synthetic checkpoint. N(0, s) is a normal of std s.
struct SynthOptions {
  uint64_t seed = 0;
  /// Shards are filled greedily up to this many bytes (a larger tensor gets a shard alone).
  uint64_t shard_size = 5'000'000'000;
  float matrix_std = 0.02f; ///< 2-D BF16 weights: embed, q/k/v/o, lm_head
  float bias_std = 0.02f;   ///< attention, router and expert biases
  float norm_std = 0.1f;    ///< norm weights are 1 + N(0, norm_std)
  float sink_std = 1.0f;
  float router_std = 0.2f;
  /// MXFP4 scale bytes are uniform in [lo, hi), hi <= 255 (0xFF is E8M0's NaN); block bytes
  /// uniform over all 256 values.
  int expert_scale_lo = 116, expert_scale_hi = 119;
  int threads = 0; ///< 0: std::thread::hardware_concurrency()
  /// Called from the calling thread with lines like "shard 1/3: 4.9 GB, 1.2 GB/s".
  std::function<void(const std::string&)> progress;
};

/// Writes a checkpoint for `config` into `out_dir` (created if needed): config.json (with
/// quantization_config mxfp4), model-0000N-of-0000M.safetensors shards holding
/// expected_tensors(config) in that order, and model.safetensors.index.json. The bytes depend
/// only on (config, seed, distributions, shard_size), never on the thread count: every 1 Mi
/// element chunk of a tensor draws from its own counter-based stream keyed by (seed, tensor
/// name, chunk index). Files are written under temporary names and renamed when all are
/// complete (config.json last), so a failed run leaves no valid-looking checkpoint behind.
/// Throws xserv::Error on bad options or I/O failure.
void synth_checkpoint(const ModelConfig& config, const std::filesystem::path& out_dir,
                      const SynthOptions& options);

} // namespace xserv::models
