// Element types of IR values and their storage sizes.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace xserv::ir {

/// Element type of a tensor. MXFP4 is the checkpoint's 4-bit expert format: a logical
/// [.., rows, cols] matrix stored as blocks of 32 values (16 bytes) plus one E8M0 scale byte.
enum class DType : uint8_t { BF16, F16, F32, I32, I64, U8, MXFP4 };

/// Printed name: "bf16", "f32", "mxfp4", ...
std::string_view dtype_name(DType t);
/// Parses a printed name; nullopt when unknown.
std::optional<DType> parse_dtype(std::string_view s);

inline bool is_float(DType t) {
  return t == DType::BF16 || t == DType::F16 || t == DType::F32 || t == DType::MXFP4;
}
inline bool is_int(DType t) {
  return t == DType::I32 || t == DType::I64 || t == DType::U8;
}

/// Bytes needed to store `numel` elements. For MXFP4, numel must be a multiple of 32:
/// 17 bytes per 32 values (16 code bytes + 1 scale byte).
uint64_t storage_bytes(DType t, uint64_t numel);

} // namespace xserv::ir
