// MXFP4 decoding (MODEL.md "MXFP4"): 32 FP4 values per 16-byte block, one E8M0 scale per block.
#pragma once

#include <cstdint>
#include <span>

namespace xserv::models {

/// Values per MXFP4 block, and bytes per block (two 4-bit codes per byte).
inline constexpr int kMxfp4BlockValues = 32;
inline constexpr int kMxfp4BlockBytes = 16;
/// The exponent bias of the E8M0 scale byte: a block is multiplied by 2^(scale - 127).
inline constexpr int kMxfp4ScaleBias = 127;

/// FP4 (E2M1) code -> value; codes 8..15 are the negatives, 8 being -0.0.
inline constexpr float kMxfp4Lut[16] = {+0.0f, 0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/// Decodes one block: out[2j] = LUT[b[j] & 15] * 2^(scale-127), out[2j+1] = LUT[b[j] >> 4] * ...
/// Exact (ldexp), including -0.0, subnormal results and infinities for huge scales.
void mxfp4_decode_block(const uint8_t* block, uint8_t scale, float* out);

/// Decodes one row of `scales.size()` blocks: `blocks` holds 16 bytes per block and `out` 32
/// floats per block. Sizes must agree (checked).
void mxfp4_decode_row(std::span<const uint8_t> blocks, std::span<const uint8_t> scales,
                      std::span<float> out);

/// Decodes a [rows, cols] matrix from blocks [rows, cols/32, 16] and scales [rows, cols/32];
/// `cols` must be a multiple of 32 and the spans sized to match (checked).
void mxfp4_decode_matrix(std::span<const uint8_t> blocks, std::span<const uint8_t> scales,
                         int64_t rows, int64_t cols, std::span<float> out);

} // namespace xserv::models
