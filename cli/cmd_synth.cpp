// `xserv synth`: a random-weight checkpoint of any gpt-oss config, in the official HF layout.
#include <cstdio>

#include <fmt/format.h>

#include "cli/commands.h"
#include "models/config.h"
#include "models/synth.h"

namespace xserv::cli {

int cmd_synth(const ParsedArgs& args) {
  if (!args.has("--config"))
    throw UsageError("missing --config CONFIG.json");
  if (!args.has("-o"))
    throw UsageError("missing -o DIR");
  const std::string config_path = args.get("--config");
  if (!std::filesystem::exists(config_path))
    throw UsageError(fmt::format("config '{}' does not exist", config_path));
  models::ModelConfig cfg = models::ModelConfig::load(config_path);
  models::SynthOptions o;
  o.seed = static_cast<uint64_t>(args.get_int("--seed", 0, 0, INT64_MAX));
  if (args.has("--shard-size"))
    o.shard_size = parse_size(args.get("--shard-size"), "--shard-size");
  o.matrix_std = static_cast<float>(args.get_double("--matrix-std", o.matrix_std));
  o.bias_std = static_cast<float>(args.get_double("--bias-std", o.bias_std));
  o.norm_std = static_cast<float>(args.get_double("--norm-std", o.norm_std));
  o.sink_std = static_cast<float>(args.get_double("--sink-std", o.sink_std));
  o.router_std = static_cast<float>(args.get_double("--router-std", o.router_std));
  o.threads = static_cast<int>(args.get_int("--threads", 0, 0, 1024));
  if (args.has("--expert-scale-range")) {
    auto r = args.list("--expert-scale-range");
    if (r.size() != 2)
      throw UsageError("--expert-scale-range takes LO,HI (scale bytes uniform in [LO, HI))");
    o.expert_scale_lo = static_cast<int>(parse_int(r[0], "--expert-scale-range", 0, 255));
    o.expert_scale_hi = static_cast<int>(parse_int(r[1], "--expert-scale-range", 0, 255));
    if (o.expert_scale_lo < 0 || o.expert_scale_hi > 255 || o.expert_scale_lo >= o.expert_scale_hi)
      throw UsageError("--expert-scale-range needs 0 <= LO < HI <= 255 (scale byte 0xFF is NaN)");
  }
  Progress progress("synth");
  o.progress = [](const std::string& line) { std::fprintf(stderr, "[synth] %s\n", line.c_str()); };
  models::synth_checkpoint(cfg, args.get("-o"), o);
  std::fprintf(stderr, "[synth] wrote %s in %.1f s\n", args.get("-o").c_str(),
               progress.total_ms() / 1e3);
  return 0;
}

} // namespace xserv::cli
