// MXFP4 decoding against the shared reference vectors, and bf16 <-> float conversion.
#include <bit>
#include <cmath>
#include <fstream>
#include <limits>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "models/bf16.h"
#include "models/mxfp4.h"
#include "tests/test_util.h"

namespace xserv::models {
namespace {

TEST_CASE("mxfp4: dequantisation matches every reference vector bit for bit") {
  XSERV_REQUIRE_DATA(data);
  std::ifstream in(data / "mxfp4_dequant_vectors.json");
  REQUIRE(in);
  nlohmann::json doc = nlohmann::json::parse(in);
  for (size_t i = 0; i < 16; ++i)
    CHECK(std::bit_cast<uint32_t>(kMxfp4Lut[i]) ==
          std::bit_cast<uint32_t>(doc["FP4_VALUES"][i].get<float>()));
  auto shape = doc["shape_blocks"].get<std::vector<int64_t>>(); // [E, R, G, 16]
  REQUIRE(shape.size() == 4);
  REQUIRE(shape[3] == kMxfp4BlockBytes);
  const int64_t experts = shape[0], rows = shape[1], groups = shape[2], cols = groups * 32;
  const auto& expect = doc["dequant_rows_layout_E_R_Gx32"];
  int checked = 0, negative_zeros = 0;
  for (int64_t e = 0; e < experts; ++e) {
    std::vector<uint8_t> blocks, scales;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < groups; ++g) {
        scales.push_back(doc["scales"][e][r][g].get<uint8_t>());
        for (int64_t j = 0; j < 16; ++j)
          blocks.push_back(doc["blocks"][e][r][g][j].get<uint8_t>());
      }
    std::vector<float> out(static_cast<size_t>(rows * cols));
    mxfp4_decode_matrix(blocks, scales, rows, cols, out);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        float want = expect[e][r][c].get<float>(), got = out[static_cast<size_t>(r * cols + c)];
        INFO("expert " << e << " row " << r << " col " << c << ": want " << want << " got " << got);
        CHECK(std::bit_cast<uint32_t>(got) == std::bit_cast<uint32_t>(want));
        negative_zeros += std::signbit(want) && want == 0.0f;
        ++checked;
      }
  }
  CHECK(checked == experts * rows * cols);
  CHECK(negative_zeros > 0); // the vectors exercise -0.0, so the bitwise check above means it
}

TEST_CASE("mxfp4: a block decodes low nibble first and scales exactly") {
  uint8_t block[16] = {};
  block[0] = 0x71; // low nibble 1 (0.5), high nibble 7 (6)
  block[1] = 0x8F; // low nibble 15 (-6), high nibble 8 (-0)
  float out[32];
  mxfp4_decode_block(block, 127 + 3, out);
  CHECK(out[0] == 4.0f);
  CHECK(out[1] == 48.0f);
  CHECK(out[2] == -48.0f);
  CHECK(std::signbit(out[3]));
  CHECK(out[3] == 0.0f);
  mxfp4_decode_block(block, 0, out); // 0.5 * 2^-127 is a float subnormal, still exact
  CHECK(out[0] == std::ldexp(1.0f, -128));
  mxfp4_decode_block(block, 255, out); // 6 * 2^128 overflows, as in the reference
  CHECK(std::isinf(out[1]));
}

TEST_CASE("bf16: conversion rounds to nearest even and keeps NaN") {
  CHECK(bf16_to_float(0x3F80) == 1.0f);
  CHECK(float_to_bf16(1.0f) == 0x3F80);
  CHECK(float_to_bf16(-2.5f) == 0xC020);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
  CHECK(float_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3F80);
  // 1 + 3*2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: rounds up to even.
  CHECK(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3F82);
  CHECK(float_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)) == 0x3F81);
  CHECK(float_to_bf16(std::numeric_limits<float>::infinity()) == 0x7F80);
  CHECK(float_to_bf16(3.4e38f) == 0x7F80); // rounds past the largest bf16 to infinity
  // A NaN whose payload lives only in the low bits must not truncate to infinity.
  uint16_t nan = float_to_bf16(std::bit_cast<float>(0xFF800001u));
  CHECK(std::isnan(bf16_to_float(nan)));
  CHECK((nan & 0x8000) != 0);
  for (uint32_t b = 0; b < 0x10000; ++b) { // every finite bf16 round-trips
    float f = bf16_to_float(static_cast<uint16_t>(b));
    if (!std::isnan(f))
      CHECK_MESSAGE(float_to_bf16(f) == b, "bf16 " << b);
  }
}

} // namespace
} // namespace xserv::models
