// Running the xserv binary from tests: exit code and output, optionally with piped stdin.
#pragma once

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include <doctest/doctest.h>

namespace xserv::testing {

struct RunResult {
  int code = -1;
  std::string out; ///< stdout, with stderr too unless split_stderr
  std::string err; ///< stderr when split_stderr
};

/// Runs a shell command; returns its stdout and exit status.
inline RunResult run_shell(const std::string& cmd) {
  RunResult r;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0)
    r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

/// The xserv binary for the GPU test executables (built without XSERV_BINARY): $XSERV_BIN, else
/// beside the running test (the device copies both into one folder), else the build tree's
/// cli/xserv; empty when none exists.
inline std::filesystem::path find_xserv_binary() {
  namespace fs = std::filesystem;
  if (const char* b = std::getenv("XSERV_BIN"); b && *b)
    return b;
  const fs::path self = fs::read_symlink("/proc/self/exe").parent_path();
  for (const fs::path& p : {self / "xserv", self.parent_path() / "cli/xserv"})
    if (fs::exists(p))
      return p;
  return {};
}

/// For GPU tests that run the xserv binary: declares `dev` (runtime::DeviceInfo) and `bin` (the
/// binary), or skips the rest of the test case saying why (no GPU, no binary). Needs
/// runtime/device.h.
#define XSERV_REQUIRE_GPU_AND_BINARY(dev, bin)                                                     \
  const ::xserv::runtime::DeviceInfo dev = ::xserv::runtime::probe_device();                       \
  if (!dev.available) {                                                                            \
    MESSAGE("skipped: no GPU (" << dev.reason << ")");                                             \
    return;                                                                                        \
  }                                                                                                \
  const std::filesystem::path bin = ::xserv::testing::find_xserv_binary();                         \
  if (bin.empty()) {                                                                               \
    MESSAGE("skipped: no xserv binary beside the test or in $XSERV_BIN");                          \
    return;                                                                                        \
  }

/// `BIN ARGS` through the shell with environment assignments `env` in front; stdout in out,
/// stderr (through a file in `dir`) in err.
inline RunResult run_binary(const std::filesystem::path& bin, const std::string& args,
                            const std::filesystem::path& dir, const std::string& env = "") {
  const std::filesystem::path err = dir / "stderr.txt";
  RunResult r =
      run_shell(env + " " + bin.string() + " " + args + " 2>" + err.string() + " </dev/null");
  std::ifstream in(err);
  r.err.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return r;
}

#ifdef XSERV_BINARY // defined for the CPU test executables, which depend on the xserv binary
/// Runs `xserv ARGS` through the shell. `stdin_text` is piped in (it must hold no single
/// quote); otherwise stdin is /dev/null. With split_stderr, stderr is kept apart in `err`.
inline RunResult run_xserv(const std::string& args, const std::string& stdin_text = "",
                           bool split_stderr = false) {
  const std::filesystem::path err_file = std::filesystem::temp_directory_path() /
                                         ("xserv_test_stderr_" + std::to_string(getpid()) + ".txt");
  std::string cmd = std::string(XSERV_BINARY) + " " + args;
  cmd += split_stderr ? " 2>" + err_file.string() : std::string(" 2>&1");
  if (!stdin_text.empty()) {
    std::string quoted = "'";
    quoted += stdin_text;
    cmd = "printf '%s' " + quoted + "' | " + cmd;
  } else {
    cmd += " < /dev/null";
  }
  RunResult r = run_shell(cmd);
  if (split_stderr) {
    std::ifstream in(err_file);
    r.err.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    std::filesystem::remove(err_file);
  }
  return r;
}

#endif

} // namespace xserv::testing
