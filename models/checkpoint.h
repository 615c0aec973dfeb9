// A gpt-oss checkpoint directory: config.json plus safetensors (one file, or shards + index),
// validated against the HF tensor layout of MODEL.md, with BF16 and MXFP4 decoding helpers.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "models/config.h"
#include "models/safetensors.h"

namespace xserv::models {

/// A tensor that the HF gpt-oss layout requires (MODEL.md "Tensors").
struct ExpectedTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};

/// Every tensor of a gpt-oss checkpoint for `config`, in a fixed order: embed_tokens, then each
/// layer (norms, attention, router, experts), then model.norm and lm_head. Expert weights are
/// MXFP4: `<base>_blocks` U8 [E, rows, cols/32, 16], `<base>_scales` U8 [E, rows, cols/32],
/// `<base>_bias` BF16 [E, rows], for gate_up (rows 2*intermediate, cols hidden) and down
/// (rows hidden, cols intermediate).
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& config);

/// How Checkpoint::open reads the safetensors files.
struct CheckpointOptions {
  /// false: headers only (pread; no tensor byte is mapped or read, for `compile`);
  /// true: mmap every file so that bytes() and the decoders work (runtime, CPU interpreter).
  bool map_data = false;
  /// Check every tensor against expected_tensors(config) while opening.
  bool validate = true;
};

/// An MXFP4 expert weight in a mapped checkpoint: logical shape [experts, rows, cols].
struct Mxfp4Tensor {
  std::string base; ///< e.g. "model.layers.0.mlp.experts.gate_up_proj"
  int64_t experts = 0, rows = 0, cols = 0;
  std::span<const uint8_t> blocks; ///< [experts, rows, cols/32, 16]
  std::span<const uint8_t> scales; ///< [experts, rows, cols/32]

  /// Decodes expert `e` into `out` of rows*cols floats (row-major [rows, cols]).
  void decode_expert(int64_t e, std::span<float> out) const;
};

/// An opened checkpoint directory. Move-only (it owns the file mappings).
class Checkpoint {
public:
  /// Opens `dir`: loads config.json (ModelConfig::load, so a non-gpt-oss config throws), then
  /// model.safetensors, or else model.safetensors.index.json and the shards it names. Index
  /// problems (a missing shard, a tensor absent from its shard, a shard tensor absent from the
  /// index) and, with options.validate, layout problems are reported together in one
  /// xserv::Error, one line each.
  static Checkpoint open(const std::filesystem::path& dir, CheckpointOptions options = {});

  const std::filesystem::path& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  bool mapped() const { return options_.map_data; }
  /// The safetensors files, in index order.
  const std::vector<SafetensorsFile>& files() const { return files_; }
  /// Every tensor name, sorted.
  std::vector<std::string> tensor_names() const;

  /// The tensor called `name`, or nullptr.
  const TensorInfo* find(std::string_view name) const;
  /// The tensor called `name`; throws xserv::Error naming the checkpoint when absent.
  const TensorInfo& info(std::string_view name) const;
  /// The file holding tensor `name` (which must exist).
  const std::filesystem::path& file_of(std::string_view name) const;

  /// Every way this checkpoint differs from the layout for `config`, one line each: missing
  /// tensors, wrong dtype or shape (naming file, expected and found), MXFP4 blocks/scales pairs
  /// that disagree, unexpected tensors. Empty when it matches.
  std::vector<std::string> problems(const ModelConfig& config) const;
  /// Throws one xserv::Error listing problems(config) when there are any.
  void validate(const ModelConfig& config) const;
  void validate() const { validate(config_); }

  /// The raw bytes of tensor `name`. Needs a mapped checkpoint (throws xserv::Error otherwise).
  std::span<const uint8_t> bytes(std::string_view name) const;
  /// Tensor `name`, which must be BF16, converted to floats (row-major). Throws xserv::Error
  /// naming the file, tensor and element when one is NaN or infinite.
  std::vector<float> read_bf16(std::string_view name) const;
  /// The largest scale byte of every MXFP4 expert weight (the `*_scales` tensors), or -1 when
  /// the checkpoint has none. Needs a mapped checkpoint; reads 1/16 of the experts' bytes.
  int max_mxfp4_scale() const;
  /// The MXFP4 expert weight `base` (`base`_blocks and `base`_scales), checked for consistency.
  Mxfp4Tensor mxfp4(std::string_view base) const;
  /// Expert `e` of `base` decoded to [rows, cols]; touches only that expert's bytes. Throws
  /// xserv::Error naming the file and tensor for a scale byte 0xFF (E8M0's NaN) and for a
  /// value that decodes to infinity (Mxfp4Tensor::decode_expert is the unchecked decode).
  std::vector<float> decode_expert(std::string_view base, int64_t e) const;
  /// All experts of `base` decoded to [experts, rows, cols] (large: 2 GB for 20b gate_up),
  /// checked as decode_expert().
  std::vector<float> decode_mxfp4(std::string_view base) const;

private:
  /// Mxfp4Tensor::decode_expert into `out`, with decode_expert()'s checks.
  void decode_checked(const Mxfp4Tensor& m, int64_t e, std::span<float> out) const;
  struct Location {
    size_t file;
    size_t tensor;
  };
  Checkpoint() = default;
  std::vector<std::string> index_problems(const std::filesystem::path& index_path);
  [[noreturn]] void fail(const std::string& what, const std::vector<std::string>& problems) const;

  std::filesystem::path dir_;
  ModelConfig config_;
  CheckpointOptions options_;
  std::vector<SafetensorsFile> files_;
  std::unordered_map<std::string, Location> tensors_;
  /// Names the index maps to a shard that is missing, unreadable or lacks them: problems()
  /// skips them so that each fault is reported once.
  std::vector<std::string> index_broken_;
};

} // namespace xserv::models
