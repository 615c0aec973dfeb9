// The compile -> run contract: plain structs that the compiler side fills and the runtime reads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace xserv::runtime {

/// A run of bytes in a file on disk that holds (part of) one tensor, e.g. a safetensors tensor.
struct WeightSource {
  std::string name;           ///< the tensor's name in its file, for messages
  std::string file;           ///< path of the file
  uint64_t offset = 0;        ///< absolute byte offset of the data in the file
  uint64_t bytes = 0;         ///< byte length of the data
  std::string dtype;          ///< safetensors dtype name: "BF16", "U8", ...
  std::vector<int64_t> shape; ///< the stored shape
};

/// One logical weight tensor the runtime places on the GPU, and how to make it from the files.
struct WeightSpec {
  /// How the stored bytes become the device tensor.
  enum class Transform {
    /// The bytes of `data` are copied as they are; the device tensor has `data.dtype`.
    Copy,
    /// `data` holds MXFP4 blocks U8 [..., G, 16] and `scales` the E8M0 scales U8 [..., G]
    /// (MODEL.md "MXFP4"); the device tensor is BF16 [..., G * 32].
    Mxfp4ToBf16,
  };

  std::string name; ///< the logical tensor, e.g. "model.layers.0.mlp.experts.gate_up_proj"
  Transform transform = Transform::Copy;
  WeightSource data;                  ///< the bytes (Copy), or the blocks (Mxfp4ToBf16)
  std::optional<WeightSource> scales; ///< the scales, for Mxfp4ToBf16 only
  std::vector<int64_t> shape;         ///< logical shape on the GPU, e.g. [E, rows, cols]
};

} // namespace xserv::runtime
