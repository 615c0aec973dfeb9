// Safetensors reader: valid files read back, and every malformed file is rejected by name.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <doctest/doctest.h>

#include "base/error.h"
#include "models/safetensors.h"
#include "tests/test_util.h"

namespace xserv::models {
namespace {

namespace fs = std::filesystem;
using xserv::testing::TempDir;

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i)
    s[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  return s;
}

/// A safetensors file: length prefix, `header` text, then `data_bytes` zero bytes.
std::string file_bytes(const std::string& header, size_t data_bytes) {
  return le64(header.size()) + header + std::string(data_bytes, '\0');
}

fs::path write(const TempDir& dir, const std::string& name, const std::string& bytes) {
  fs::path p = dir.path / name;
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}

/// The message SafetensorsFile::open gives for `bytes` written to a file; fails the test when
/// the file opens. Also checks the in-memory parser agrees and the message names the file.
std::string open_error(const std::string& bytes) {
  TempDir dir;
  fs::path p = write(dir, "bad.safetensors", bytes);
  std::string msg;
  try {
    SafetensorsFile::open(p);
    FAIL("expected an error for " << p);
  } catch (const Error& e) {
    msg = e.what();
  }
  CHECK(msg.find(p.string()) != std::string::npos);
  auto span = std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  CHECK_THROWS_AS(parse_safetensors(span, "mem"), Error);
  return msg;
}

const std::string kTwo = R"({"__metadata__":{"format":"pt"},)"
                         R"("a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},)"
                         R"("b":{"dtype":"U8","shape":[4],"data_offsets":[12,16]}})";

TEST_CASE("safetensors: a valid file opens mapped and headers-only") {
  TempDir dir;
  std::string bytes = le64(kTwo.size()) + kTwo;
  for (int i = 0; i < 16; ++i)
    bytes.push_back(static_cast<char>(i));
  fs::path p = write(dir, "ok.safetensors", bytes);
  SafetensorsFile f = SafetensorsFile::open(p);
  REQUIRE(f.tensors().size() == 2);
  CHECK(f.metadata().at("format") == "pt");
  const TensorInfo* b = f.find("b");
  REQUIRE(b);
  CHECK(b->dtype == "U8");
  CHECK(b->shape == std::vector<int64_t>{4});
  CHECK(b->offset == 8 + kTwo.size() + 12);
  CHECK(f.bytes(*b)[3] == 15);
  CHECK(f.find("c") == nullptr);
  SafetensorsFile moved = std::move(f);
  CHECK(moved.bytes(*moved.find("a"))[1] == 1);

  SafetensorsFile h = SafetensorsFile::read_header_only(p);
  CHECK(!h.mapped());
  CHECK(h.find("a")->shape == std::vector<int64_t>{2, 3});
  CHECK_THROWS_WITH_AS(h.bytes(*h.find("a")), doctest::Contains("headers-only"), Error);
}

TEST_CASE("safetensors: make_safetensors_header lays tensors out back to back") {
  std::vector<TensorSpec> specs = {{"x", "F32", {2, 2}}, {"y", "F4", {6}}, {"z", "U8", {0}}};
  std::string bytes = make_safetensors_header(specs, {{"format", "pt"}});
  CHECK((bytes.size() - 8) % 8 == 0);
  bytes += std::string(16 + 3, '\0');
  SafetensorsHeader h = parse_safetensors(
      std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), "m");
  REQUIRE(h.tensors.size() == 3);
  CHECK(h.tensors[0].name == "x");
  CHECK(h.tensors[1].size == 3);
  CHECK(h.tensors[2].size == 0);
}

TEST_CASE("safetensors: truncated files") {
  CHECK(open_error("\x10\x00\x00").find("fewer than the 8-byte header length") !=
        std::string::npos);
  std::string good = le64(kTwo.size()) + kTwo + std::string(16, '\0');
  std::string cut = good.substr(0, good.size() - 1);
  CHECK(open_error(cut).find("tensor 'b' data_offsets [12, 16] run past the end of the data "
                             "(15 bytes): the file is truncated") != std::string::npos);
  std::string no_data = le64(kTwo.size()) + kTwo.substr(0, 20);
  CHECK(open_error(no_data).find("header length") != std::string::npos);
}

TEST_CASE("safetensors: header length beyond the file, and absurd") {
  CHECK(open_error(le64(1000) + "{}")
            .find("header length 1000 runs past the end of the file "
                  "(10 bytes)") != std::string::npos);
  CHECK(open_error(le64(uint64_t{1} << 63) + "{}")
            .find("header length 9223372036854775808 "
                  "exceeds the limit") != std::string::npos);
  CHECK(open_error(le64(~uint64_t{0}) + "{}").find("exceeds the limit") != std::string::npos);
}

TEST_CASE("safetensors: header not JSON, not an object, not UTF-8") {
  CHECK(open_error(file_bytes("{\"a\": ", 0)).find("header is not valid JSON") !=
        std::string::npos);
  CHECK(open_error(file_bytes("[1, 2]", 0)).find("header must be a JSON object, found array") !=
        std::string::npos);
  CHECK(open_error(file_bytes("\"\xff\"", 0)).find("not valid UTF-8") != std::string::npos);
  CHECK(open_error(file_bytes(std::string("{}\0\0", 4), 0)).find("contains a NUL byte") !=
        std::string::npos);
  CHECK(open_error(file_bytes(" {}", 0)).find("must start with '{'") != std::string::npos);
}

TEST_CASE("safetensors: bad entries") {
  auto entry = [](const std::string& body, size_t data) {
    return open_error(file_bytes("{\"w\":" + body + "}", data));
  };
  CHECK(entry(R"({"dtype":"Q4","shape":[4],"data_offsets":[0,4]})", 4)
            .find("tensor 'w': unknown dtype 'Q4'") != std::string::npos);
  CHECK(entry(R"({"dtype":"F16","shape":[3],"data_offsets":[0,4]})", 4)
            .find("tensor 'w': F16 [3] needs 6 bytes but data_offsets [0, 4] hold 4") !=
        std::string::npos);
  CHECK(entry(R"({"dtype":"U8","shape":[-1],"data_offsets":[0,0]})", 0)
            .find("non-negative integers") != std::string::npos);
  CHECK(entry(R"({"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]})", 0)
            .find("overflows") != std::string::npos);
  CHECK(entry(R"({"dtype":"U8","shape":[4]})", 4).find("data_offsets") != std::string::npos);
  CHECK(entry(R"({"dtype":"U8","shape":[4],"data_offsets":[4,0]})", 4)
            .find("end before they begin") != std::string::npos);
  CHECK(entry(R"({"dtype":"F4","shape":[3],"data_offsets":[0,2]})", 2).find("whole bytes") !=
        std::string::npos);
  CHECK(open_error(file_bytes(R"({"__metadata__":{"format":1}})", 0))
            .find("'__metadata__.format' must be a string") != std::string::npos);
}

TEST_CASE("safetensors: overlapping, gapped and short data offsets") {
  std::string overlap = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                        R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})";
  CHECK(open_error(file_bytes(overlap, 6))
            .find("tensor 'b' data_offsets [2, 6] overlap tensor 'a' ending at 4") !=
        std::string::npos);
  std::string gap = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                    R"("b":{"dtype":"U8","shape":[4],"data_offsets":[5,9]}})";
  CHECK(open_error(file_bytes(gap, 9))
            .find("gap in the data: tensor 'b' starts at 5 but tensor 'a' ends at 4") !=
        std::string::npos);
  std::string late = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}})";
  CHECK(open_error(file_bytes(late, 12)).find("first tensor 'a' starts at 8, not 0") !=
        std::string::npos);
  std::string one = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})";
  CHECK(open_error(file_bytes(one, 7))
            .find("the tensors end at data offset 4 but the data section holds 7 bytes") !=
        std::string::npos);
}

TEST_CASE("safetensors: a tensor named twice is a duplicate, not a gap") {
  // JSON would keep the second entry and leave the first one's bytes looking like a gap.
  std::string twice = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                      R"("a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})";
  const std::string e = open_error(file_bytes(twice, 8));
  CHECK(e.find("header names 'a' twice (a duplicate key)") != std::string::npos);
  CHECK(e.find("gap") == std::string::npos);
  // The same name under __metadata__ and as a tensor are different levels: not a duplicate.
  std::string meta = R"({"__metadata__":{"a":"x"},"a":{"dtype":"U8","shape":[4],)"
                     R"("data_offsets":[0,4]}})";
  const std::string ok = file_bytes(meta, 4);
  CHECK_NOTHROW(
      parse_safetensors(std::span(reinterpret_cast<const uint8_t*>(ok.data()), ok.size()), "mem"));
}

TEST_CASE("safetensors: a missing file is named") {
  CHECK_THROWS_WITH_AS(SafetensorsFile::read_header_only("/nonexistent/x.safetensors"),
                       doctest::Contains("/nonexistent/x.safetensors: cannot open"), Error);
}

} // namespace
} // namespace xserv::models
