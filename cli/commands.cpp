// The command table: names, usage, options and handlers of every xserv subcommand.
#include "cli/commands.h"

namespace xserv::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {{"compile",
        "MODEL_DIR (-o PLAN_DIR | --emit ir) [options]",
        "compile a gpt-oss checkpoint (or a directory holding only config.json) into a plan",
        {{"-o", "PLAN_DIR", "write the plan directory here", "--output"},
         {"--emit", "ir|plan", "stop and print the IR (ir) or write the plan (plan, default)"},
         {"--passes", "P1,P2", "pass pipeline (default: cse,dce)"},
         {"--dump-after", "P1,P2", "print the IR after these passes ('all' for every pass)"},
         {"--verify-after-all", "", "verify the IR after every pass"},
         {"--stop-after", "N", "run only the first N passes"},
         {"--dump-dir", "DIR", "write NN_pass.ir files for each step here"},
         {"--all-logits", "", "return logits for every token, not only each sequence's last"},
         {"--max-batch", "B", "most sequences decoded together (default 64)"},
         {"--max-seq", "S", "longest sequence, prompt plus output (default 8192)"},
         {"--pp", "N", "pipeline stages (default 1)"},
         {"--arch", "sm_XX", "GPU architecture (default sm_90)"}},
        1,
        1},
       &cmd_compile},
  };
  return table;
}

} // namespace xserv::cli
