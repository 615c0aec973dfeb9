// Reading (mmap or headers only) and validating single safetensors files, and building headers.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace xserv::models {

/// The largest header the reference implementation accepts (100 MB).
inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

/// Bits per element of a safetensors dtype name ("BF16" -> 16, "F4" -> 4); 0 when unknown.
int safetensors_dtype_bits(std::string_view dtype);

/// One tensor of a safetensors file.
struct TensorInfo {
  std::string name;
  std::string dtype;          ///< safetensors dtype name, e.g. "BF16", "U8"
  std::vector<int64_t> shape; ///< every dimension >= 0
  uint64_t offset = 0;        ///< absolute byte offset of the data in the file
  uint64_t size = 0;          ///< bytes; equals numel() * dtype bits / 8

  int64_t numel() const;
};

/// The parsed and validated header of one safetensors file.
struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;             ///< sorted by offset, contiguous
  std::map<std::string, std::string> metadata; ///< the optional "__metadata__" object
  uint64_t data_start = 0;                     ///< 8 + header length
  uint64_t file_size = 0;
};

/// Reads the 8-byte little-endian header length from the first bytes of a file of `file_size`
/// bytes and checks it as the reference does (file >= 8 bytes, length <= 100 MB, 8 + length <=
/// file size). Returns the length. `source` names the file in messages.
uint64_t parse_safetensors_header_length(std::span<const uint8_t> first8, uint64_t file_size,
                                         const std::string& source);

/// Parses and validates the JSON header text of a file of `file_size` bytes whose data section
/// starts at `data_start`: UTF-8, a JSON object, "__metadata__" string->string, known dtypes,
/// sizes matching shapes, offsets contiguous from 0 and ending exactly at the end of the file.
/// Throws xserv::Error naming `source` and the problem.
SafetensorsHeader parse_safetensors_json(std::string_view json_text, uint64_t data_start,
                                         uint64_t file_size, const std::string& source);

/// Parses and validates a whole safetensors file held in memory (used by tests and the fuzzer).
SafetensorsHeader parse_safetensors(std::span<const uint8_t> file, const std::string& source);

/// A tensor to lay out in a new safetensors file: offsets are assigned in order.
struct TensorSpec {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};

/// The bytes that start a safetensors file holding `tensors` back to back, in the given order:
/// the 8-byte length, then the JSON header padded with spaces to a multiple of 8 (as the
/// reference writer does). The tensor data must follow in the same order.
std::string make_safetensors_header(std::span<const TensorSpec> tensors,
                                    const std::map<std::string, std::string>& metadata);

/// A validated safetensors file: either memory-mapped (tensor bytes readable) or headers only
/// (shapes and dtypes, read with pread; the tensor bytes are never touched). Move-only.
class SafetensorsFile {
public:
  /// Maps `path` read-only and validates its header. Throws xserv::Error on any problem.
  static SafetensorsFile open(const std::filesystem::path& path);
  /// Reads and validates only the header of `path`; bytes() is unavailable on the result.
  static SafetensorsFile read_header_only(const std::filesystem::path& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::filesystem::path& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  uint64_t file_size() const { return header_.file_size; }
  /// True when opened with open(), so that bytes() works.
  bool mapped() const { return !headers_only_; }

  /// The tensor called `name`, or nullptr.
  const TensorInfo* find(std::string_view name) const;
  /// The bytes of `t`, which must belong to this file. Throws xserv::Error when the file was
  /// opened headers-only.
  std::span<const uint8_t> bytes(const TensorInfo& t) const;

private:
  SafetensorsFile() = default;
  void release() noexcept;

  std::filesystem::path path_;
  SafetensorsHeader header_;
  std::unordered_map<std::string, size_t> index_;
  const uint8_t* map_ = nullptr;
  size_t map_size_ = 0;
  bool headers_only_ = false;
};

} // namespace xserv::models
