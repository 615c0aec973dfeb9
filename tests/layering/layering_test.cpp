// The layers of docs/ARCHITECTURE.md, held from two sides: the sources' #include graph, followed
// transitively (which folder may include which, and that no CUDA header reaches server/ or cli/
// through any chain of includes), and the CMake link graph as CMake resolved it (no library or
// test binary links a layer above its own). Each rule is also shown able to fail: the checker
// runs on a planted tree with one violation of each kind.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace fs = std::filesystem;

namespace {

/// The folders each source folder may include from (itself always). "runtime/plan.h" names a
/// single header of another folder.
const std::map<std::string, std::set<std::string>> kMayInclude = {
    {"base", {}},
    {"ir", {"base"}},
    {"models", {"ir", "base"}},
    {"compiler", {"ir", "base"}},
    {"codegen", {"compiler", "ir", "base", "runtime/plan.h"}},
    {"driver", {"codegen", "compiler", "models", "ir", "base", "runtime"}},
    {"runtime", {"base"}},
    {"engine", {"runtime", "models", "ir", "base"}},
    {"server", {"engine", "models", "base"}},
    {"cli", {"server", "engine", "driver", "runtime", "models", "ir", "base"}},
};

/// Folders no CUDA header may reach, through any chain of includes.
const std::set<std::string> kNoCuda = {"base", "ir", "models", "compiler", "server", "cli"};

const std::regex kQuoted(R"re(^\s*#\s*include\s+"([^"]+)")re");
const std::regex kAngled(R"re(^\s*#\s*include\s+<([^>]+)>)re");
const std::regex kCudaHeader(R"re(^(cuda|cublas|nccl|nvrtc)[A-Za-z0-9_]*\.h$)re");

/// A source tree's include graph: each file's project includes and system includes.
struct IncludeGraph {
  std::map<std::string, std::vector<std::string>> local, system;

  explicit IncludeGraph(const fs::path& root) {
    for (const auto& [folder, unused] : kMayInclude) {
      (void)unused;
      if (!fs::is_directory(root / folder))
        continue;
      for (const auto& e : fs::recursive_directory_iterator(root / folder)) {
        const std::string ext = e.path().extension().string();
        if (ext != ".cpp" && ext != ".h" && ext != ".cuh")
          continue;
        const std::string rel = fs::relative(e.path(), root).string();
        std::ifstream in(e.path());
        for (std::string line; std::getline(in, line);) {
          std::smatch m;
          if (std::regex_search(line, m, kQuoted) && fs::exists(root / m[1].str()))
            local[rel].push_back(m[1].str());
          else if (std::regex_search(line, m, kAngled))
            system[rel].push_back(m[1].str());
        }
        local[rel];
      }
    }
  }

  /// A chain of includes from `file` to a CUDA header ("a.h -> b.h -> <cuda_runtime_api.h>"),
  /// or "" when none reaches one.
  std::string cuda_chain(const std::string& file) const {
    std::map<std::string, std::string> via; // file -> the file that included it first
    std::vector<std::string> todo = {file};
    via[file] = "";
    while (!todo.empty()) {
      const std::string f = todo.back();
      todo.pop_back();
      if (auto s = system.find(f); s != system.end())
        for (const std::string& h : s->second)
          if (std::regex_match(fs::path(h).filename().string(), kCudaHeader)) {
            std::string chain = "<" + h + ">";
            for (std::string at = f; !at.empty(); at = via.at(at))
              chain = at + " -> " + chain;
            return chain;
          }
      if (auto l = local.find(f); l != local.end())
        for (const std::string& g : l->second)
          if (via.emplace(g, f).second)
            todo.push_back(g);
    }
    return "";
  }
};

std::string folder_of(const std::string& path) {
  return path.substr(0, path.find('/'));
}

/// Every violation of the folder rules and of the CUDA rule in the tree at `root`, one line each.
std::vector<std::string> violations(const fs::path& root) {
  const IncludeGraph g(root);
  std::vector<std::string> out;
  for (const auto& [file, includes] : g.local) {
    const std::string from = folder_of(file);
    const std::set<std::string>& allowed = kMayInclude.at(from);
    for (const std::string& inc : includes) {
      const std::string to = folder_of(inc);
      if (to != from && !allowed.count(to) && !allowed.count(inc) && to != "tests")
        out.push_back(file + " includes " + inc + " (" + from + "/ may not include " + to + "/)");
    }
    if (kNoCuda.count(from))
      if (const std::string chain = g.cuda_chain(file); !chain.empty())
        out.push_back("a CUDA header reaches " + file + ": " + chain);
  }
  return out;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines)
    s += l + "\n";
  return s;
}

/// tests/CMakeLists.txt's link_graph.txt: each xserv library and test binary and the xserv
/// libraries it links, transitively.
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

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

} // namespace

TEST_CASE("layering: every folder includes only the layers below it, followed transitively") {
  const std::vector<std::string> v = violations(xserv::testing::source_dir());
  CHECK_MESSAGE(v.empty(), joined(v));
  // The graph is real: the server reaches the engine, the engine reaches a CUDA header through
  // the runtime, and the CLI reaches the driver.
  const IncludeGraph g(xserv::testing::source_dir());
  CHECK_FALSE(g.cuda_chain("engine/pipeline/stage.cpp").empty());
  CHECK_FALSE(g.cuda_chain("driver/plan_kernels.cpp").empty());
  CHECK(g.cuda_chain("cli/cmd_serve.cpp").empty());
  CHECK(g.cuda_chain("server/server.cpp").empty());
}

TEST_CASE("layering: a planted violation of each rule is found") {
  xserv::testing::TempDir tmp("layering_planted");
  const fs::path r = tmp.path;
  write(r / "runtime/device.h", "#pragma once\n#include <cuda_runtime_api.h>\n");
  write(r / "runtime/plan.h", "#pragma once\n");
  write(r / "engine/model.h", "#pragma once\n#include \"runtime/device.h\"\n");
  // A server header that reaches CUDA two includes away, through a layer it may include.
  write(r / "server/http.h", "#pragma once\n#include \"engine/model.h\"\n");
  // A runtime file that climbs to the engine, and codegen reaching past runtime/plan.h.
  write(r / "runtime/weights.cpp", "#include \"engine/model.h\"\n");
  write(r / "codegen/emit.cpp", "#include \"runtime/plan.h\"\n#include \"runtime/device.h\"\n");
  // Clean: the CLI including the server, the engine including the runtime.
  write(r / "cli/cmd_serve.cpp", "#include \"server/http.h\"\n");
  const std::string v = joined(violations(r));
  INFO(v);
  CHECK(v.find("a CUDA header reaches server/http.h: server/http.h -> engine/model.h -> "
               "runtime/device.h -> <cuda_runtime_api.h>") != std::string::npos);
  CHECK(v.find("a CUDA header reaches cli/cmd_serve.cpp") != std::string::npos);
  CHECK(v.find("runtime/weights.cpp includes engine/model.h") != std::string::npos);
  CHECK(v.find("codegen/emit.cpp includes runtime/device.h") != std::string::npos);
  CHECK(v.find("codegen/emit.cpp includes runtime/plan.h") == std::string::npos);
  CHECK(v.find("engine/model.h includes") == std::string::npos);
}

TEST_CASE("layering: no library or test binary links a layer above its own") {
  const auto g = link_graph();
  // Run time never links the compile side, so it can never come to lower a graph again.
  const std::map<std::string, std::vector<std::string>> forbidden = {
      {"xserv_base", {"xserv_ir", "xserv_runtime", "xserv_engine", "xserv_cli"}},
      {"xserv_runtime",
       {"xserv_ir", "xserv_models", "xserv_compiler", "xserv_codegen", "xserv_driver",
        "xserv_engine", "xserv_server", "xserv_cli"}},
      {"xserv_codegen", {"xserv_models", "xserv_driver", "xserv_engine", "xserv_cli"}},
      {"xserv_driver", {"xserv_engine", "xserv_server", "xserv_cli"}},
      {"xserv_engine",
       {"xserv_compiler", "xserv_codegen", "xserv_driver", "xserv_server", "xserv_cli"}},
      {"xserv_server", {"xserv_compiler", "xserv_codegen", "xserv_driver", "xserv_cli"}},
      {"runtime_tests", {"xserv_engine", "xserv_driver", "xserv_server", "xserv_cli"}},
      {"driver_tests", {"xserv_engine", "xserv_server", "xserv_cli"}},
      {"engine_tests", {"xserv_server", "xserv_cli"}},
      {"server_tests", {"xserv_driver", "xserv_cli"}},
  };
  for (const auto& [target, above] : forbidden) {
    CAPTURE(target);
    REQUIRE(g.count(target) == 1);
    for (const std::string& lib : above)
      CHECK_MESSAGE(g.at(target).count(lib) == 0, target << " links " << lib);
  }
  // The graph can show an edge: the CLI links every layer, the server the engine and runtime.
  for (const char* lib : {"xserv_server", "xserv_driver", "xserv_engine", "xserv_runtime"})
    CHECK(g.at("xserv_cli").count(lib) == 1);
  CHECK(g.at("xserv_server").count("xserv_engine") == 1);
  CHECK(g.at("xserv_engine").count("xserv_runtime") == 1);
}
