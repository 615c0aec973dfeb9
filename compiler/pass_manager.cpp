// PassManager: the passes in list order, logging and timing each step.
#include "compiler/pass_manager.h"

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include <fmt/format.h>

#include "base/error.h"

namespace xserv::compiler {

PassManager::PassManager(PassManagerOptions opts, PassOptions pass_opts)
    : opts_(std::move(opts)), pass_opts_(pass_opts) {}

std::ostream& PassManager::log() const {
  return opts_.log ? *opts_.log : std::cerr;
}

void PassManager::add(std::string_view name) {
  const PassInfo* p = find_pass(name);
  if (!p) {
    std::string known;
    for (const auto& q : registered_passes())
      known += (known.empty() ? "" : ", ") + std::string(q.name);
    throw Error(fmt::format("unknown pass '{}' (known passes: {})", name, known));
  }
  passes_.push_back(p);
}

void PassManager::add_passes(std::string_view list) {
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string_view::npos)
      end = list.size();
    std::string_view name = list.substr(start, end - start);
    while (!name.empty() && name.front() == ' ')
      name.remove_prefix(1);
    while (!name.empty() && name.back() == ' ')
      name.remove_suffix(1);
    if (!name.empty())
      add(name);
    start = end + 1;
  }
}

ir::Graph PassManager::run(ir::Graph g) {
  ir::verify_or_throw(g, "before the first pass");
  for (const auto& want : opts_.dump_after)
    if (want != "all" && !find_pass(want))
      throw Error(fmt::format("--dump-after names unknown pass '{}'", want));
  if (!opts_.dump_dir.empty())
    std::filesystem::create_directories(opts_.dump_dir);
  timings_.clear();
  for (size_t i = 0; i < passes_.size(); ++i) {
    if (opts_.stop_after >= 0 && static_cast<int>(i) >= opts_.stop_after) {
      if (opts_.debug >= 1)
        log() << fmt::format("[pass] stopping after {} pass(es) (--stop-after)\n", i);
      break;
    }
    const PassInfo& p = *passes_[i];
    auto t0 = std::chrono::steady_clock::now();
    PassResult r = p.run(g, pass_opts_);
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    timings_.push_back({p.name, ms, r.changed, r.graph.size()});
    if (opts_.verify_after_all)
      ir::verify_or_throw(r.graph, fmt::format("after pass {}", p.name));
    g = std::move(r.graph);
    if (opts_.debug >= 1)
      log() << fmt::format("[pass] {:2} {:<12} {:8.2f} ms  {:5} nodes  {}\n", i + 1, p.name, ms,
                           g.size(), r.changed ? "changed" : "(unchanged)");
    bool dump = opts_.debug >= 2;
    for (const auto& want : opts_.dump_after)
      dump = dump || want == "all" || want == p.name;
    if (dump)
      log() << fmt::format("// ----- IR after {} -----\n{}", p.name, ir::print(g));
    if (!opts_.dump_dir.empty()) {
      auto path = opts_.dump_dir / fmt::format("{:02}_{}.ir", i + 1, p.name);
      std::ofstream(path) << ir::print(g);
    }
  }
  return g;
}

} // namespace xserv::compiler
