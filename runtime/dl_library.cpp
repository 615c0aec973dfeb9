// dlopen of the CUDA libraries xserv reaches at run time.
#include "runtime/dl_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/error.h"

namespace xserv::runtime {

DlLibrary dl_open_cuda_library(const std::string& soname, const std::string& what) {
  DlLibrary lib;
  lib.soname = soname;
  std::vector<std::string> tried = {soname};
  if (const char* home = std::getenv("CUDA_HOME"); home && *home)
    tried.push_back(std::string(home) + "/lib64/" + soname);
  tried.push_back("/usr/local/cuda/lib64/" + soname);
  for (const std::string& path : tried)
    if ((lib.handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)))
      return lib;
  lib.error =
      fmt::format("cannot load {} (tried {}): {}", what, fmt::join(tried, ", "), ::dlerror());
  return lib;
}

void* dl_symbol(DlLibrary& lib, const char* name) {
  void* p = lib.handle ? ::dlsym(lib.handle, name) : nullptr;
  if (!p && lib.error.empty())
    lib.error = fmt::format("{} has no {}", lib.soname, name);
  return p;
}

void dl_fail(const DlLibrary& lib) {
  throw Error(lib.error);
}

} // namespace xserv::runtime
