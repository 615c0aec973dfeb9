// The CUDA libraries xserv opens at run time (NCCL, cuBLAS) rather than links: binaries and
// plans that never use them need none, and a missing one is an error naming what was tried.
#pragma once

#include <string>

namespace xserv::runtime {

/// A shared library opened with dlopen: `handle`, or why it could not be (`error`).
struct DlLibrary {
  void* handle = nullptr;
  std::string soname; ///< e.g. "libnccl.so.2"
  std::string error;  ///< set when opening or a symbol failed; the first failure wins
};

/// Opens `soname` from the loader's path, else $CUDA_HOME/lib64, else /usr/local/cuda/lib64;
/// `what` names the library in the error ("NCCL").
DlLibrary dl_open_cuda_library(const std::string& soname, const std::string& what);

/// The address of `name` in `lib` (null, recording lib.error, when it has none).
void* dl_symbol(DlLibrary& lib, const char* name);

/// dl_symbol cast to the entry point's type.
template <typename F> void dl_resolve(DlLibrary& lib, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dl_symbol(lib, name));
}

/// Throws xserv::Error with lib.error (what opening or resolving it reported).
[[noreturn]] void dl_fail(const DlLibrary& lib);

/// `api` (a struct holding a DlLibrary `lib` and its resolved entry points) when every part of
/// it loaded, else dl_fail.
template <typename Api> const Api& dl_loaded(const Api& api) {
  if (!api.lib.error.empty())
    dl_fail(api.lib);
  return api;
}

} // namespace xserv::runtime
