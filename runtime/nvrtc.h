// Compiling CUDA C++ source to a cubin for one GPU architecture with NVRTC, in process.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace xserv::runtime {

/// How compile_cuda() builds a kernel. Every field takes part in the kernel cache key.
struct CompileOptions {
  /// A real architecture, "sm_90" or "sm_90a"; the cubin runs only on that architecture.
  std::string arch = "sm_90";
  std::string std = "c++17";
  /// Preprocessor definitions as (name, value); an empty value defines the name as 1.
  std::vector<std::pair<std::string, std::string>> defines;
  /// Headers handed to NVRTC in memory, by include name ("xserv_kernels/common.cuh" -> source),
  /// so kernels include our own headers without touching the disk. Hashed into the cache key.
  std::map<std::string, std::string> headers;
  /// Extra include directories on disk (-I). Only the paths are hashed, not the files in them:
  /// prefer `headers` for anything that changes.
  std::vector<std::string> include_dirs;
  /// Adds -I for the CUDA toolkit's headers (cuda_bf16.h, cuda_fp16.h, ...), which NVRTC does
  /// not carry built in; see cuda_include_dir().
  bool cuda_headers = true;
  bool line_info = true;  ///< -lineinfo, for profilers and compute-sanitizer
  bool fast_math = false; ///< --use_fast_math; off so kernels match the CPU reference
  /// Further NVRTC flags, passed as given after the ones above.
  std::vector<std::string> extra_flags;
  /// When set, the NVRTC log (and on failure the numbered source) is also written here.
  std::filesystem::path log_path;

  /// The NVRTC command-line flags these options stand for, in a fixed order.
  std::vector<std::string> flags() const;
};

/// The output of one NVRTC compilation.
struct CompileResult {
  std::vector<char> cubin; ///< an ELF image for CompileOptions::arch
  std::string log;         ///< NVRTC's log: warnings; empty for a clean compile
  double compile_ms = 0;   ///< wall time of nvrtcCompileProgram plus cubin extraction
};

/// Compiles `source` (named `name`, e.g. the kernel's name; ".cu" is appended for messages)
/// for `opts.arch`. Needs no GPU. Throws xserv::Error on an unknown architecture or a compile
/// error; the message holds NVRTC's log and the source with line numbers on the left, the lines
/// the log names marked with '>'.
CompileResult compile_cuda(const std::string& source, const std::string& name,
                           const CompileOptions& opts);

/// The CUDA toolkit's include directory: $CUDA_HOME/include or $CUDA_PATH/include when it holds
/// cuda_bf16.h, else the toolkit this binary was built against. Empty when none is found.
std::string cuda_include_dir();

/// NVRTC's version, "13.0".
std::string nvrtc_version();

/// The architectures this NVRTC can compile for, as "sm_XX" names, ascending.
std::vector<std::string> nvrtc_supported_archs();

/// How many compilations compile_cuda() has run in this process (for tests and debug output).
uint64_t nvrtc_compile_count();

/// `source` with right-aligned line numbers on the left ("  12 | ..."). When `marked` is not
/// empty, those lines get a '>' in the margin, and a source longer than `max_lines` shows only
/// the marked lines with `context` lines around each.
std::string numbered_source(const std::string& source, const std::vector<int>& marked = {},
                            int max_lines = 200, int context = 4);

} // namespace xserv::runtime
