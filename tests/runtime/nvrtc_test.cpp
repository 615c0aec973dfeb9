// CPU tests of kernel compilation (NVRTC, no GPU needed), SHA-256 and the cubin cache.
#include "base/error.h"
#include "runtime/device.h"
#include "runtime/kernel_cache.h"
#include "runtime/module.h"
#include "runtime/nvrtc.h"
#include "runtime/sha256.h"
#include "tests/test_util.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <unistd.h>

namespace fs = std::filesystem;
using xserv::testing::TempDir;
using namespace xserv::runtime;

namespace {

const char* kAddSource = R"(// kernel: add_f32
extern "C" __global__ void add_f32(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    c[i] = a[i] + b[i];
}
)";

std::string error_of(const auto& fn) {
  try {
    fn();
  } catch (const xserv::Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

} // namespace

TEST_CASE("a small kernel compiles to an sm_90 cubin without a GPU") {
  CompileOptions opts;
  opts.arch = "sm_90";
  CompileResult r = compile_cuda(kAddSource, "add_f32", opts);
  REQUIRE(r.cubin.size() > 64);
  CHECK(std::string(r.cubin.data(), 4) == "\x7f"
                                          "ELF");
  CHECK(cubin_sm(r.cubin) == 90);
  CHECK(r.compile_ms > 0);
  CHECK(r.log.empty());
  MESSAGE("NVRTC " << nvrtc_version() << ": " << r.cubin.size() << " bytes in " << r.compile_ms
                   << " ms");
}

TEST_CASE("the cubin's ELF header records the architecture it was built for") {
  for (auto [arch, sm] : {std::pair{"sm_80", 80}, {"sm_89", 89}, {"sm_90a", 90}, {"sm_100", 100}}) {
    CompileOptions opts;
    opts.arch = arch;
    CHECK(cubin_sm(compile_cuda(kAddSource, "add_f32", opts).cubin) == sm);
  }
  std::vector<char> not_elf = {'h', 'e', 'l', 'l', 'o'};
  CHECK(error_of([&] { cubin_sm(not_elf); }).find("not a cubin") != std::string::npos);
}

TEST_CASE("flags follow the options in a fixed order, fast math off by default") {
  CompileOptions opts;
  opts.arch = "sm_90a";
  opts.defines = {{"TILE", "64"}, {"XSERV_DEBUG", ""}};
  opts.cuda_headers = false;
  opts.extra_flags = {"-Xptxas=-v"};
  std::vector<std::string> want = {"--gpu-architecture=sm_90a",
                                   "-std=c++17",
                                   "-lineinfo",
                                   "-DTILE=64",
                                   "-DXSERV_DEBUG",
                                   "-Xptxas=-v"};
  CHECK(opts.flags() == want);
  opts.fast_math = true;
  CHECK(opts.flags()[3] == "--use_fast_math");
}

TEST_CASE("a syntax error reports NVRTC's log and the numbered source") {
  TempDir dir;
  CompileOptions opts;
  opts.log_path = dir.path / "dump" / "nvrtc.log";
  const char* broken = "extern \"C\" __global__ void broken(int* x) {\n"
                       "  int y = 1\n"
                       "  x[0] = y;\n"
                       "}\n";
  std::string msg = error_of([&] { compile_cuda(broken, "broken", opts); });
  CHECK(msg.find("could not compile kernel 'broken' for sm_90") != std::string::npos);
  CHECK(msg.find("broken.cu(3): error: expected a \";\"") != std::string::npos);
  CHECK(msg.find(">    3 |   x[0] = y;") != std::string::npos);
  CHECK(msg.find("     1 | extern \"C\" __global__ void broken(int* x) {") != std::string::npos);
  CHECK(read_text(opts.log_path) == msg);
}

TEST_CASE("numbered_source shows windows around the marked lines of a long source") {
  std::string src;
  for (int i = 1; i <= 300; ++i)
    src += "line " + std::to_string(i) + "\n";
  std::string out = numbered_source(src, {150}, 200, 2);
  CHECK(out == "      ...\n   148 | line 148\n   149 | line 149\n>  150 | line 150\n"
               "   151 | line 151\n   152 | line 152\n      ...\n");
  CHECK(numbered_source("a\nb\n") == "     1 | a\n     2 | b\n");
}

TEST_CASE("kernels include our headers from memory and the toolkit's bf16 header") {
  const char* src = R"(#include "xserv_kernels/common.cuh"
#include <cuda_bf16.h>
extern "C" __global__ void scale(__nv_bfloat16* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    x[i] = __float2bfloat16_rn(xserv_scale(__bfloat162float(x[i])));
}
)";
  CompileOptions opts;
  opts.headers["xserv_kernels/common.cuh"] =
      "#pragma once\n__device__ inline float xserv_scale(float v) { return 2.0f * v; }\n";
  CHECK(compile_cuda(src, "scale", opts).cubin.size() > 64);

  CompileOptions without = opts;
  without.headers.clear();
  std::string msg = error_of([&] { compile_cuda(src, "scale", without); });
  CHECK(msg.find("xserv_kernels/common.cuh") != std::string::npos);
  CHECK(msg.find(">    1 | #include \"xserv_kernels/common.cuh\"") != std::string::npos);
}

TEST_CASE("an architecture NVRTC cannot target is refused with the list it can") {
  CompileOptions opts;
  opts.arch = "compute_90";
  CHECK(error_of([&] {
          compile_cuda(kAddSource, "add_f32", opts);
        }).find("not a real GPU architecture") != std::string::npos);
  opts.arch = "sm_35";
  std::string msg = error_of([&] { compile_cuda(kAddSource, "add_f32", opts); });
  CHECK(msg.find("cannot compile for sm_35") != std::string::npos);
  CHECK(msg.find("sm_90") != std::string::npos);
}

TEST_CASE("sha256 matches the FIPS 180-4 vectors") {
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // One million 'a' fed in uneven pieces exercises the block buffering.
  Sha256 h;
  std::string chunk(997, 'a');
  size_t left = 1000000;
  for (size_t i = 1; left > 0; ++i) {
    size_t n = std::min(left, i % 7 == 0 ? chunk.size() : i % 64);
    h.update(chunk.data(), n);
    left -= n;
  }
  CHECK(h.hex_digest() == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Digesting does not end the stream: more bytes may follow.
  Sha256 g;
  g.update("ab");
  CHECK(g.hex_digest() == sha256_hex("ab"));
  g.update("c");
  CHECK(g.hex_digest() == sha256_hex("abc"));
}

TEST_CASE("sha256: whole blocks (the SHA extensions when the CPU has them) agree with the buffer") {
  // Fed a byte at a time, every block goes through the portable compression via the buffer; fed
  // at once, whole blocks take runtime/sha256_ni.cpp on a CPU with SHA-NI.
  std::string data;
  uint32_t x = 12345;
  for (int i = 0; i < 5000; ++i) {
    x = x * 1103515245u + 12345u;
    data += static_cast<char>(x >> 24);
  }
  for (size_t n : {size_t(0), size_t(1), size_t(55), size_t(63), size_t(64), size_t(65),
                   size_t(127), size_t(128), size_t(640), size_t(4999), size_t(5000)}) {
    CAPTURE(n);
    Sha256 bytewise;
    for (size_t i = 0; i < n; ++i)
      bytewise.update(data.data() + i, 1);
    CHECK(sha256_hex(std::string_view(data).substr(0, n)) == bytewise.hex_digest());
  }
}

TEST_CASE("sha256 fields are length-prefixed and files hash like their bytes") {
  Sha256 a, b;
  a.update_field("ab");
  a.update_field("c");
  b.update_field("a");
  b.update_field("bc");
  CHECK(a.hex_digest() != b.hex_digest());

  TempDir dir;
  std::string bytes(3 * 1000 * 1000 + 17, 'x');
  std::ofstream(dir.path / "f.bin", std::ios::binary) << bytes;
  CHECK(sha256_file_hex(dir.path / "f.bin") == sha256_hex(bytes));
  CHECK_THROWS_AS(sha256_file_hex(dir.path / "missing.bin"), xserv::Error);
}

TEST_CASE("the kernel cache compiles once and recompiles for another arch or source") {
  TempDir dir;
  std::vector<std::string> notices;
  auto notice = [&](const std::string& line) { notices.push_back(line); };
  CompileOptions opts;

  uint64_t before = nvrtc_compile_count();
  CachedCubin first = get_or_compile(kAddSource, "add_f32", opts, dir.path, notice);
  CHECK(first.compiled);
  CHECK(nvrtc_compile_count() == before + 1);
  CHECK(fs::exists(dir.path / "add_f32.cubin"));
  CHECK(fs::exists(dir.path / "add_f32.key"));
  CHECK(first.key.size() == 64);

  CachedCubin second = get_or_compile(kAddSource, "add_f32", opts, dir.path, notice);
  CHECK_FALSE(second.compiled);
  CHECK(nvrtc_compile_count() == before + 1);
  CHECK(second.cubin == first.cubin);
  CHECK(notices.empty());

  CompileOptions other_arch = opts;
  other_arch.arch = "sm_80";
  CachedCubin third = get_or_compile(kAddSource, "add_f32", other_arch, dir.path, notice);
  CHECK(third.compiled);
  CHECK(cubin_sm(third.cubin) == 80);
  REQUIRE(notices.size() == 1);
  CHECK(notices[0] ==
        "xserv: recompiling kernel add_f32 (it was built for sm_90, this needs sm_80)");

  std::string changed = std::string(kAddSource) + "// a comment\n";
  CHECK(get_or_compile(changed, "add_f32", other_arch, dir.path, notice).compiled);
  REQUIRE(notices.size() == 2);
  CHECK(notices[1] == "xserv: recompiling kernel add_f32 (its source changed)");

  CompileOptions defined = other_arch;
  defined.defines = {{"UNROLL", "4"}};
  CHECK(get_or_compile(changed, "add_f32", defined, dir.path, notice).compiled);
  CHECK(notices.back().find("compile options or headers changed") != std::string::npos);
  CHECK(nvrtc_compile_count() == before + 4);

  // Nothing but the entry itself is left behind: no temporary files.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir.path))
    files += e.is_regular_file();
  CHECK(files == 2);
}

TEST_CASE("the kernel cache rebuilds a damaged cubin and refuses unsafe names") {
  TempDir dir;
  std::vector<std::string> notices;
  auto notice = [&](const std::string& line) { notices.push_back(line); };
  CompileOptions opts;
  CachedCubin good = get_or_compile(kAddSource, "add_f32", opts, dir.path, notice);
  std::ofstream(dir.path / "add_f32.cubin", std::ios::binary | std::ios::trunc) << "\x7f"
                                                                                   "ELF";
  CachedCubin again = get_or_compile(kAddSource, "add_f32", opts, dir.path, notice);
  CHECK(again.compiled);
  CHECK(again.cubin == good.cubin);
  REQUIRE(notices.size() == 1);
  CHECK(notices[0] == "xserv: recompiling kernel add_f32 (its cubin is damaged)");

  CHECK(error_of([&] {
          get_or_compile(kAddSource, "../escape", opts, dir.path);
        }).find("cannot name a cache file") != std::string::npos);
}

TEST_CASE("the cache key covers headers and options but not the log path") {
  CompileOptions opts;
  std::string key = kernel_cache_key(kAddSource, "add_f32", opts);
  CompileOptions logged = opts;
  logged.log_path = "/tmp/elsewhere/nvrtc.log";
  CHECK(kernel_cache_key(kAddSource, "add_f32", logged) == key);
  CompileOptions with_header = opts;
  with_header.headers["a.cuh"] = "// a";
  CHECK(kernel_cache_key(kAddSource, "add_f32", with_header) != key);
  CompileOptions fast = opts;
  fast.fast_math = true;
  CHECK(kernel_cache_key(kAddSource, "add_f32", fast) != key);
  CHECK(kernel_cache_key(kAddSource, "add_f32_v2", opts) != key);
}

TEST_CASE("loading a module without a GPU says so") {
  DeviceInfo dev = probe_device();
  if (dev.available) {
    MESSAGE("skipped: a GPU is present (" << dev.name << ")");
    return;
  }
  CompileOptions opts;
  auto cubin = compile_cuda(kAddSource, "add_f32", opts).cubin;
  std::string msg = error_of([&] { Module::load(cubin, "add_f32"); });
  CHECK(msg.find("cannot load module add_f32") != std::string::npos);
  MESSAGE(msg);
}
