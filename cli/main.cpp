// The xserv binary: dispatches to a subcommand and turns errors into messages and exit codes.
#include <cstdio>
#include <exception>
#include <string>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/env.h"

namespace {

void print_help() {
  std::string out =
      "xserv: an ahead-of-time compiler and runtime for gpt-oss models on NVIDIA GPUs.\n\n"
      "usage: xserv COMMAND [ARGS]   (xserv COMMAND --help for its options)\n\ncommands:\n";
  for (const auto& c : xserv::cli::commands())
    out += fmt::format("  {:<10} {}\n", c.spec.name, c.spec.summary);
  out += "\nenvironment: XSERV_DEBUG=1 pass names and timings, =2 also the IR after each pass;\n"
         "  every XSERV_* variable is listed in docs/DESIGN.md (\"Environment variables\").\n";
  std::fputs(out.c_str(), stdout);
}

} // namespace

int main(int argc, char** argv) {
  using namespace xserv::cli;
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
      std::string(argv[1]) == "help") {
    print_help();
    return argc < 2 ? 2 : 0;
  }
  const std::string name = argv[1];
  const Command* cmd = nullptr;
  for (const auto& c : commands())
    if (c.spec.name == name)
      cmd = &c;
  if (!cmd) {
    std::fprintf(stderr, "xserv: unknown command '%s' (see xserv --help)\n", name.c_str());
    return 2;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  for (const auto& a : args)
    if (a == "--help" || a == "-h") {
      std::fputs(command_help(cmd->spec).c_str(), stdout);
      return 0;
    }
  try {
    env(); // every XSERV_* variable checked before the command starts
    return cmd->run(parse_args(cmd->spec, args));
  } catch (const UsageError& e) {
    std::fprintf(stderr, "\nxserv %s: %s\n", name.c_str(), e.what());
    return 2;
  } catch (const xserv::Error& e) {
    std::fprintf(stderr, "\nxserv %s: error: %s\n", name.c_str(), e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "\nxserv %s: error: out of memory\n", name.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\nxserv %s: error: %s\n", name.c_str(), e.what());
    return 1;
  }
}
