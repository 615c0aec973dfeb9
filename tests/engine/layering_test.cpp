// The dependency rules of docs/ARCHITECTURE.md, read from the sources' #include lines: runtime/
// and engine/ include nothing from compiler/ or codegen/ (run time never lowers a graph), and
// cli/ includes no CUDA header. The CUDA models still in cli/ are listed: the list may only
// shrink (they move to engine/ once the plan carries everything they take from the graph).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>

#include "tests/test_util.h"

namespace fs = std::filesystem;

namespace {

/// Files under `folder` (sources and headers) that #include a path matching `pattern`.
std::set<std::string> including(const std::string& folder, const std::regex& pattern) {
  std::set<std::string> out;
  const fs::path root = xserv::testing::source_dir();
  for (const auto& e : fs::recursive_directory_iterator(root / folder)) {
    const std::string ext = e.path().extension().string();
    if (ext != ".cpp" && ext != ".h" && ext != ".cuh")
      continue;
    std::ifstream in(e.path());
    for (std::string line; std::getline(in, line);)
      if (line.rfind("#include", 0) == 0 && std::regex_search(line, pattern)) {
        out.insert(fs::relative(e.path(), root).string());
        break;
      }
  }
  return out;
}

} // namespace

TEST_CASE("layering: runtime/ and engine/ include nothing from compiler/ or codegen/") {
  // cli/ is included neither: it links the compiler side, so it would bring it in indirectly.
  const std::regex compile_side(R"(#include\s+"(compiler|codegen|cli)/)");
  CHECK(including("runtime", compile_side).empty());
  CHECK(including("engine", compile_side).empty());
  // The rule must be able to fail: the lowering itself includes the compiler side.
  CHECK_FALSE(including("cli", compile_side).empty());
}

TEST_CASE("layering: engine/ includes no CUDA header, cli/ no more than the listed models") {
  const std::regex cuda(R"(#include\s+<(cuda|cuda_runtime|cuda_runtime_api|nccl|nvrtc)[^>]*>)");
  CHECK(including("engine", cuda).empty());
  const std::set<std::string> allowed = {"cli/cmd_trace.cpp", "cli/cuda_model_impl.h",
                                         "cli/pipeline_local.cpp"};
  for (const std::string& f : including("cli", cuda)) {
    CAPTURE(f);
    CHECK(allowed.count(f) == 1);
  }
  CHECK_FALSE(including("runtime", cuda).empty());
}
