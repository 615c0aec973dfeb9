// Conversions between bfloat16 bit patterns and float (round to nearest even, NaN kept NaN).
#pragma once

#include <bit>
#include <cstdint>

namespace xserv::models {

/// The float whose upper 16 bits are `b` (exact: bf16 is a truncated float).
inline float bf16_to_float(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

/// The bf16 nearest to `f`, ties to even. A NaN stays a NaN with its sign (forced quiet, since
/// truncating its payload could otherwise turn it into an infinity).
inline uint16_t float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u)
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

} // namespace xserv::models
