// MXFP4 block, row and matrix decoding, bit-exact with the reference dequantisation.
#include "models/mxfp4.h"

#include <cmath>
#include <string>

#include "base/error.h"

namespace xserv::models {

void mxfp4_decode_block(const uint8_t* block, uint8_t scale, float* out) {
  // Scaling the 16 LUT entries once per block is exact (ldexp) and keeps the inner loop a lookup.
  float lut[16];
  int e = static_cast<int>(scale) - kMxfp4ScaleBias;
  for (int i = 0; i < 16; ++i)
    lut[i] = std::ldexp(kMxfp4Lut[i], e);
  for (int j = 0; j < kMxfp4BlockBytes; ++j) {
    out[2 * j] = lut[block[j] & 0x0F];
    out[2 * j + 1] = lut[block[j] >> 4];
  }
}

void mxfp4_decode_row(std::span<const uint8_t> blocks, std::span<const uint8_t> scales,
                      std::span<float> out) {
  size_t g = scales.size();
  XSERV_CHECK(blocks.size() == g * kMxfp4BlockBytes && out.size() == g * kMxfp4BlockValues,
              "mxfp4 row: " + std::to_string(blocks.size()) + " block bytes, " + std::to_string(g) +
                  " scales, " + std::to_string(out.size()) + " outputs");
  for (size_t i = 0; i < g; ++i)
    mxfp4_decode_block(blocks.data() + i * kMxfp4BlockBytes, scales[i],
                       out.data() + i * kMxfp4BlockValues);
}

void mxfp4_decode_matrix(std::span<const uint8_t> blocks, std::span<const uint8_t> scales,
                         int64_t rows, int64_t cols, std::span<float> out) {
  XSERV_CHECK(rows >= 0 && cols >= 0 && cols % kMxfp4BlockValues == 0,
              "mxfp4 matrix: cols " + std::to_string(cols) + " not a multiple of 32");
  auto r = static_cast<size_t>(rows), g = static_cast<size_t>(cols / kMxfp4BlockValues);
  XSERV_CHECK(blocks.size() == r * g * kMxfp4BlockBytes && scales.size() == r * g &&
                  out.size() == r * g * kMxfp4BlockValues,
              "mxfp4 matrix: span sizes disagree with [" + std::to_string(rows) + ", " +
                  std::to_string(cols) + "]");
  for (size_t i = 0; i < r; ++i)
    mxfp4_decode_row(blocks.subspan(i * g * kMxfp4BlockBytes, g * kMxfp4BlockBytes),
                     scales.subspan(i * g, g), out.subspan(i * g * kMxfp4BlockValues, g * 32));
}

} // namespace xserv::models
