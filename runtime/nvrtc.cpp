// NVRTC wrapper: flags from CompileOptions, in-memory headers, cubin out, readable errors.
#include "runtime/nvrtc.h"

#include "base/error.h"

#include <nvrtc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <sstream>

namespace xserv::runtime {
namespace {

std::atomic<uint64_t> g_compile_count{0};

/// Throws for an NVRTC call that failed for a reason other than the user's source.
void check_nvrtc(nvrtcResult r, const char* what, const std::string& name) {
  if (r != NVRTC_SUCCESS)
    throw Error("NVRTC " + std::string(what) + " failed for kernel '" + name +
                "': " + nvrtcGetErrorString(r));
}

/// Destroys an nvrtcProgram on scope exit.
struct ProgramGuard {
  nvrtcProgram prog = nullptr;
  ~ProgramGuard() {
    if (prog)
      nvrtcDestroyProgram(&prog);
  }
};

/// "sm_90" / "sm_90a" -> 90; throws for anything else, or what this NVRTC cannot target.
int parse_arch(const std::string& arch, const std::string& name) {
  static const std::regex re("sm_([0-9]+)[af]?");
  std::smatch m;
  if (!std::regex_match(arch, m, re))
    throw Error("kernel '" + name + "': architecture '" + arch +
                "' is not a real GPU architecture like sm_90 or sm_90a");
  int sm = std::stoi(m[1]);
  auto supported = nvrtc_supported_archs();
  if (std::find(supported.begin(), supported.end(), "sm_" + std::to_string(sm)) ==
      supported.end()) {
    std::string list;
    for (const auto& a : supported)
      list += (list.empty() ? "" : " ") + a;
    throw Error("kernel '" + name + "': NVRTC " + nvrtc_version() + " cannot compile for " + arch +
                " (supported: " + list + ")");
  }
  return sm;
}

/// Line numbers of `file` that the log reports problems at ("file(12): error: ...").
std::vector<int> lines_in_log(const std::string& log, const std::string& file) {
  std::vector<int> lines;
  std::string needle = file + "(";
  for (size_t pos = log.find(needle); pos != std::string::npos; pos = log.find(needle, pos + 1)) {
    if (pos > 0 && log[pos - 1] != '\n')
      continue;
    size_t start = pos + needle.size();
    size_t end = log.find(')', start);
    if (end == std::string::npos)
      break;
    try {
      lines.push_back(std::stoi(log.substr(start, end - start)));
    } catch (const std::exception&) {
    }
  }
  return lines;
}

void write_log(const std::filesystem::path& path, const std::string& text) {
  std::error_code ec;
  if (path.has_parent_path())
    std::filesystem::create_directories(path.parent_path(), ec);
  std::ofstream out(path, std::ios::binary);
  if (!out)
    throw Error("cannot write the NVRTC log to " + path.string());
  out << text;
}

} // namespace

std::vector<std::string> CompileOptions::flags() const {
  std::vector<std::string> f;
  // sm_90 compiles for its arch-specific target sm_90a: a cubin of either runs on exactly the
  // compute capability 9.0 devices, and sm_90a's may use warpgroup MMA (codegen/kernels/wgmma.cuh).
  f.push_back("--gpu-architecture=" + (arch == "sm_90" ? std::string("sm_90a") : arch));
  f.push_back("-std=" + std);
  if (line_info)
    f.push_back("-lineinfo");
  if (fast_math)
    f.push_back("--use_fast_math");
  for (const auto& [k, v] : defines)
    f.push_back("-D" + k + (v.empty() ? "" : "=" + v));
  for (const auto& dir : include_dirs)
    f.push_back("-I" + dir);
  if (cuda_headers) {
    std::string dir = cuda_include_dir();
    if (!dir.empty())
      f.push_back("-I" + dir);
  }
  f.insert(f.end(), extra_flags.begin(), extra_flags.end());
  return f;
}

std::string cuda_include_dir() {
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    const char* root = std::getenv(var);
    if (root && *root &&
        std::filesystem::exists(std::filesystem::path(root) / "include/cuda_bf16.h"))
      return (std::filesystem::path(root) / "include").string();
  }
#ifdef XSERV_CUDA_INCLUDE_DIR
  if (std::filesystem::exists(std::filesystem::path(XSERV_CUDA_INCLUDE_DIR) / "cuda_bf16.h"))
    return XSERV_CUDA_INCLUDE_DIR;
#endif
  return {};
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS)
    return "unknown";
  return std::to_string(major) + "." + std::to_string(minor);
}

std::vector<std::string> nvrtc_supported_archs() {
  int n = 0;
  if (nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0)
    return {};
  std::vector<int> archs(n);
  if (nvrtcGetSupportedArchs(archs.data()) != NVRTC_SUCCESS)
    return {};
  std::sort(archs.begin(), archs.end());
  std::vector<std::string> out;
  for (int a : archs)
    out.push_back("sm_" + std::to_string(a));
  return out;
}

uint64_t nvrtc_compile_count() {
  return g_compile_count.load();
}

std::string numbered_source(const std::string& source, const std::vector<int>& marked,
                            int max_lines, int context) {
  std::vector<std::string> lines;
  std::istringstream in(source);
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  int n = static_cast<int>(lines.size());
  int width = std::max(4, static_cast<int>(std::to_string(n).size()));
  std::set<int> marks(marked.begin(), marked.end());
  // Which lines to show: all of a short source, else windows around the marked lines.
  std::vector<bool> show(n + 1, n <= max_lines || marks.empty());
  for (int m : marks)
    for (int l = std::max(1, m - context); l <= std::min(n, m + context); ++l)
      show[l] = true;
  std::string out;
  bool gap = false;
  for (int l = 1; l <= n; ++l) {
    if (!show[l]) {
      gap = true;
      continue;
    }
    if (gap)
      out += std::string(width + 2, ' ') + "...\n";
    gap = false;
    std::string num = std::to_string(l);
    out += (marks.count(l) ? "> " : "  ") + std::string(width - num.size(), ' ') + num + " | " +
           lines[l - 1] + "\n";
  }
  if (gap)
    out += std::string(width + 2, ' ') + "...\n";
  return out;
}

CompileResult compile_cuda(const std::string& source, const std::string& name,
                           const CompileOptions& opts) {
  parse_arch(opts.arch, name);
  const std::string file = name + ".cu";

  std::vector<const char*> header_src, header_names;
  for (const auto& [include_name, text] : opts.headers) {
    header_names.push_back(include_name.c_str());
    header_src.push_back(text.c_str());
  }
  ProgramGuard guard;
  check_nvrtc(nvrtcCreateProgram(&guard.prog, source.c_str(), file.c_str(),
                                 static_cast<int>(header_src.size()), header_src.data(),
                                 header_names.data()),
              "nvrtcCreateProgram", name);

  std::vector<std::string> flags = opts.flags();
  std::vector<const char*> argv;
  for (const auto& f : flags)
    argv.push_back(f.c_str());

  auto t0 = std::chrono::steady_clock::now();
  nvrtcResult compiled =
      nvrtcCompileProgram(guard.prog, static_cast<int>(argv.size()), argv.data());
  ++g_compile_count;

  CompileResult result;
  size_t log_size = 0;
  check_nvrtc(nvrtcGetProgramLogSize(guard.prog, &log_size), "nvrtcGetProgramLogSize", name);
  if (log_size > 1) {
    result.log.resize(log_size);
    check_nvrtc(nvrtcGetProgramLog(guard.prog, result.log.data()), "nvrtcGetProgramLog", name);
    result.log.resize(log_size - 1); // drop the terminating NUL
  }

  if (compiled != NVRTC_SUCCESS) {
    std::string flag_line;
    for (const auto& f : flags)
      flag_line += " " + f;
    std::string message = "NVRTC could not compile kernel '" + name + "' for " + opts.arch + " (" +
                          nvrtcGetErrorString(compiled) + "), flags:" + flag_line + "\n" +
                          result.log + (result.log.ends_with('\n') ? "" : "\n") + "source of " +
                          file + ":\n" + numbered_source(source, lines_in_log(result.log, file));
    if (!opts.log_path.empty()) {
      try {
        write_log(opts.log_path, message);
      } catch (const Error&) { // the compile error matters more than a lost log
      }
    }
    throw Error(message);
  }

  size_t cubin_size = 0;
  check_nvrtc(nvrtcGetCUBINSize(guard.prog, &cubin_size), "nvrtcGetCUBINSize", name);
  result.cubin.resize(cubin_size);
  check_nvrtc(nvrtcGetCUBIN(guard.prog, result.cubin.data()), "nvrtcGetCUBIN", name);
  result.compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!opts.log_path.empty())
    write_log(opts.log_path, result.log);
  return result;
}

} // namespace xserv::runtime
