// A cubin cache on disk, keyed by a SHA-256 of everything that decides the cubin's bytes.
#pragma once

#include "runtime/nvrtc.h"

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace xserv::runtime {

/// A cubin from the cache, and whether NVRTC had to run for it.
struct CachedCubin {
  std::vector<char> cubin;
  std::string key;            ///< kernel_cache_key() of the request, 64 hex characters
  bool compiled = false;      ///< true when the entry was missing, stale or damaged and was rebuilt
  double compile_ms = 0;      ///< NVRTC time when compiled, else 0
  std::filesystem::path path; ///< CACHE_DIR/NAME.cubin
};

/// Receives the one-line notices the cache prints when it recompiles a stale entry.
using CacheNotice = std::function<void(const std::string&)>;

/// The cache key: SHA-256 over the kernel name, its source, the in-memory headers, the options
/// that decide the code (arch, flags) and the NVRTC version. The CUDA include directory's path
/// and CompileOptions::log_path are left out, so moving the toolkit does not invalidate entries.
std::string kernel_cache_key(const std::string& source, const std::string& name,
                             const CompileOptions& opts);

/// Returns the cubin for (source, name, opts), from CACHE_DIR/NAME.cubin when its recorded key
/// (CACHE_DIR/NAME.key) matches, else compiling with compile_cuda() and storing the result
/// atomically (temp file + rename, cubin before key). A stale entry (another arch, source,
/// options or NVRTC version) or a damaged one is recompiled after a one-line notice, sent to
/// `notice` or, when that is empty, to stderr. An empty `cache_dir` compiles without a cache
/// (no file is read or written). `name` must be a plain file name
/// ([A-Za-z0-9_.-]). Throws xserv::Error on compile errors and when the cache cannot be
/// written.
CachedCubin get_or_compile(const std::string& source, const std::string& name,
                           const CompileOptions& opts, const std::filesystem::path& cache_dir,
                           const CacheNotice& notice = {});

/// A kernel to compile: its extern "C" name (also its cache file's) and its CUDA source.
struct KernelCode {
  std::string name;
  std::string source;
};

/// get_or_compile() of every kernel, in parallel (NVRTC compiles independent programs
/// concurrently; each kernel has its own cache files); the cubins in `kernels`' order. Throws
/// the first kernel's xserv::Error, after every compile has finished.
std::vector<CachedCubin> get_or_compile_all(const std::vector<KernelCode>& kernels,
                                            const CompileOptions& opts,
                                            const std::filesystem::path& cache_dir);

} // namespace xserv::runtime
