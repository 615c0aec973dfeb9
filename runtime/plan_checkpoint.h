// The checkpoint a plan was compiled from: the fingerprints compile records (config digest,
// shard sizes, sampled and full hashes) and the checks that run's checkpoint is still that one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/plan_file.h"

namespace xserv::runtime {

/// Identifies the model a plan was built for: a hash (FNV-1a 64) of its config.json bytes,
/// "fnv1a64:HEX". Throws xserv::Error naming the file when it cannot be read.
std::string config_digest(const std::filesystem::path& config_file);

/// A cheap fingerprint of a large file: SHA-256 over its size, its first 64 KiB (a safetensors
/// header and more) and 64 blocks of 4 KiB spread evenly over the rest: about 320 KiB read
/// per shard. It tells a shard replaced by another of the same size (other weights) from the
/// original; an edit confined to bytes it does not sample goes unnoticed.
std::string sampled_file_digest(const std::filesystem::path& file);

/// SHA-256 (hex) of each whole file of `files`, in order: files hashed in parallel (a thread
/// each, as many as the CPU has cores), each read once in large sequential reads. Throws
/// xserv::Error naming a file that cannot be read.
std::vector<std::string> full_file_digests(const std::vector<std::filesystem::path>& files);

/// What verify_weights read.
struct WeightsVerified {
  size_t files = 0;
  uint64_t bytes = 0;
  double seconds = 0;
};

/// --verify-weights: hashes every safetensors file `plan` lists, whole, and compares each with
/// the SHA-256 compile recorded. Throws xserv::Error naming plan.json and the file on a
/// mismatch, or when the plan records no full digest (a plan from an older compile).
WeightsVerified verify_weights(const std::filesystem::path& plan_dir, const Plan& plan,
                               const std::filesystem::path& model_dir);

/// Checks that the config block compile stored in plan.json (`plan.config`) is still the
/// checkpoint's (`checkpoint_config`, ModelConfig's JSON form of its config.json), field by
/// field: an edit of either is refused naming the field and both values.
void check_plan_config(const std::filesystem::path& plan_dir, const Plan& plan,
                       const std::filesystem::path& config_file,
                       const nlohmann::json& checkpoint_config);

/// Checks that `model_dir` is still the checkpoint `plan` (read from `plan_dir`) was compiled
/// from: the same config.json bytes, and every listed safetensors file present with its size
/// and sampled digest. Throws xserv::Error naming plan.json, the file and "recompile the plan".
void check_checkpoint(const std::filesystem::path& plan_dir, const Plan& plan,
                      const std::filesystem::path& model_dir);

} // namespace xserv::runtime
