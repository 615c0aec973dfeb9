// The dependency rules of docs/ARCHITECTURE.md, from two sides: the sources' #include lines
// (runtime/ and engine/ include nothing from compiler/, codegen/ or cli/; cli/ and engine/ include
// no CUDA header; the CUDA model knows no graph) and the CMake target graph as CMake resolved it
// (xserv_runtime and xserv_engine do not link xserv_compiler, xserv_codegen or xserv_cli), so
// run time can never come to lower a graph again. Each rule is also shown able to fail.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
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

const std::regex kCompileSide(R"(#include\s+"(compiler|codegen|cli)/)");
const std::regex kCudaHeader(R"(#include\s+<(cuda|cublas|nccl|nvrtc)[^>]*>)");

/// tests/CMakeLists.txt's link_graph.txt: each xserv library and the xserv libraries it links,
/// transitively.
std::map<std::string, std::set<std::string>> link_graph() {
  std::ifstream in(XSERV_LINK_GRAPH);
  REQUIRE_MESSAGE(in.good(), "cannot read " << XSERV_LINK_GRAPH << " (written by CMake)");
  std::map<std::string, std::set<std::string>> g;
  for (std::string line; std::getline(in, line);) {
    const size_t colon = line.find(':');
    REQUIRE_MESSAGE(colon != std::string::npos, "malformed line: " << line);
    std::istringstream deps(line.substr(colon + 1));
    std::set<std::string>& out = g[line.substr(0, colon)];
    for (std::string d; deps >> d;)
      out.insert(d);
  }
  return g;
}

} // namespace

TEST_CASE("layering: runtime/ and engine/ include nothing from compiler/, codegen/ or cli/") {
  // cli/ counts too: it links the compiler side, so it would bring it in indirectly.
  CHECK(including("runtime", kCompileSide).empty());
  CHECK(including("engine", kCompileSide).empty());
  // The rule can fail: the compile command includes the compiler side.
  CHECK(including("cli", kCompileSide).count("cli/cmd_compile.cpp") == 1);
}

TEST_CASE("layering: cli/ and engine/ include no CUDA header, runtime/ holds the CUDA calls") {
  CHECK(including("cli", kCudaHeader).empty());
  CHECK(including("engine", kCudaHeader).empty());
  CHECK(including("runtime", kCudaHeader).count("runtime/device_stage.cpp") == 1);
}

TEST_CASE("layering: the CUDA model knows no graph, only its stage program") {
  // engine/ may use ir/ for the CPU model (the interpreter) and the tensors at a pipeline
  // boundary; the CUDA model and the step plumbing it shares take ir/'s Error type at most.
  const std::regex ir_beyond_error(R"(#include\s+"ir/(?!error\.h"))");
  for (const std::string& f : including("engine", ir_beyond_error)) {
    CAPTURE(f);
    CHECK(f.find("cuda_model") == std::string::npos);
    CHECK(f.find("step_split") == std::string::npos);
    CHECK(f.find("weight_specs") == std::string::npos);
  }
  CHECK(including("engine", ir_beyond_error).count("engine/cpu_model.h") == 1);
}

TEST_CASE("layering: xserv_runtime and xserv_engine do not link the compiler side") {
  const auto g = link_graph();
  for (const char* lib : {"xserv_runtime", "xserv_engine"}) {
    CAPTURE(lib);
    REQUIRE(g.count(lib) == 1);
    for (const char* forbidden : {"xserv_compiler", "xserv_codegen", "xserv_cli"})
      CHECK_MESSAGE(g.at(lib).count(forbidden) == 0, (std::string(lib) + " links " + forbidden));
  }
  // Run time's own libraries are there, and the graph can show a forbidden edge: cli links all.
  CHECK(g.at("xserv_engine").count("xserv_runtime") == 1);
  CHECK(g.at("xserv_engine").count("xserv_models") == 1);
  for (const char* lib : {"xserv_compiler", "xserv_codegen", "xserv_engine", "xserv_runtime"})
    CHECK(g.at("xserv_cli").count(lib) == 1);
}
