// SHA-256 (FIPS 180-4), for kernel cache keys and model digests; no external dependency.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace xserv::runtime {

/// An incremental SHA-256: update() any number of times; digest() of the bytes so far.
class Sha256 {
public:
  Sha256();
  /// Feeds `size` bytes.
  void update(const void* data, size_t size);
  void update(std::string_view bytes) { update(bytes.data(), bytes.size()); }
  /// Feeds a length-prefixed field, so that ("ab","c") and ("a","bc") hash differently.
  void update_field(std::string_view bytes);
  /// The 32-byte digest of everything fed so far; feeding may continue afterwards.
  std::array<uint8_t, 32> digest() const;
  /// digest() as 64 lowercase hex characters.
  std::string hex_digest() const;

private:
  void compress(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

/// SHA-256 of `bytes` as lowercase hex.
std::string sha256_hex(std::string_view bytes);

/// SHA-256 of a file's contents as lowercase hex, read in chunks. Throws xserv::Error when the
/// file cannot be read.
std::string sha256_file_hex(const std::filesystem::path& path);

} // namespace xserv::runtime
