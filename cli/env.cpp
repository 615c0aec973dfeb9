// parse_env / env(): each XSERV_* variable read once, its value checked, errors naming it.
#include "cli/env.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "cli/args.h"

namespace xserv::cli {

namespace {

class Reader {
public:
  explicit Reader(const std::function<const char*(const char*)>& get) : get_(get) {}

  /// The value of `name`, or nullopt when unset or empty.
  std::optional<std::string> text(const char* name) const {
    const char* v = get_(name);
    if (!v || !*v)
      return std::nullopt;
    return std::string(v);
  }

  [[noreturn]] void bad(const char* name, const std::string& value, const char* accepts) const {
    throw UsageError(
        fmt::format("environment variable {} must be {}, got '{}'", name, accepts, value));
  }

  /// "0" or "1".
  std::optional<bool> flag(const char* name) const {
    const auto v = text(name);
    if (!v)
      return std::nullopt;
    if (*v != "0" && *v != "1")
      bad(name, *v, "0 or 1");
    return *v == "1";
  }

  std::optional<int> integer(const char* name, int lo, int hi) const {
    const auto v = text(name);
    if (!v)
      return std::nullopt;
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(v->c_str(), &end, 10);
    if (errno || end != v->c_str() + v->size() || n < lo || n > hi)
      bad(name, *v, fmt::format("an integer in [{}, {}]", lo, hi).c_str());
    return static_cast<int>(n);
  }

  /// Seconds (> 0, finite) as milliseconds, at least 100.
  std::optional<std::chrono::milliseconds> seconds(const char* name) const {
    const auto v = text(name);
    if (!v)
      return std::nullopt;
    char* end = nullptr;
    const double s = std::strtod(v->c_str(), &end);
    if (end != v->c_str() + v->size() || !std::isfinite(s) || s <= 0 || s > 1e7)
      bad(name, *v, "a number of seconds above 0");
    return std::chrono::milliseconds(static_cast<int64_t>(std::max(0.1, s) * 1000));
  }

  /// One of `names`.
  std::optional<std::string> choice(const char* name, std::initializer_list<const char*> names,
                                    const char* accepts) const {
    const auto v = text(name);
    if (!v)
      return std::nullopt;
    for (const char* n : names)
      if (*v == n)
        return v;
    bad(name, *v, accepts);
  }

  /// "NAME[:TIMES]": a kernel name fragment and a repeat count in [2, 16] (default 2).
  std::optional<std::pair<std::string, int>> repeat(const char* name) const {
    const auto v = text(name);
    if (!v)
      return std::nullopt;
    const size_t colon = v->rfind(':');
    std::string kernel = v->substr(0, colon);
    int times = 2;
    if (colon != std::string::npos) {
      char* end = nullptr;
      errno = 0;
      const long n = std::strtol(v->c_str() + colon + 1, &end, 10);
      if (errno || end == v->c_str() + colon + 1 || *end != '\0' || n < 2 || n > 16)
        bad(name, *v, "NAME or NAME:TIMES with TIMES in [2, 16]");
      times = static_cast<int>(n);
    }
    if (kernel.empty())
      bad(name, *v, "NAME or NAME:TIMES with a kernel name fragment NAME");
    return std::make_pair(std::move(kernel), times);
  }

  /// "RANK:WHAT@STEP" with WHAT one of the faults engine/pipeline/wire.h injects.
  std::optional<PipelineFault> fault(const char* name) const {
    const auto v = text(name);
    if (!v)
      return std::nullopt;
    const char* accepts = "RANK:WHAT@STEP (WHAT: exit, hang, stop, stall or narrow)";
    const size_t colon = v->find(':'), at = v->find('@');
    if (colon == std::string::npos || at == std::string::npos || at < colon)
      bad(name, *v, accepts);
    PipelineFault f;
    f.what = v->substr(colon + 1, at - colon - 1);
    const std::string rank = v->substr(0, colon), step = v->substr(at + 1);
    char* end = nullptr;
    errno = 0;
    const long r = std::strtol(rank.c_str(), &end, 10);
    const bool rank_ok = !rank.empty() && *end == '\0' && !errno && r >= 0 && r < (1 << 16);
    const long long s = std::strtoll(step.c_str(), &end, 10);
    const bool step_ok = !step.empty() && *end == '\0' && !errno && s >= 0;
    if (!rank_ok || !step_ok ||
        (f.what != "exit" && f.what != "hang" && f.what != "stop" && f.what != "stall" &&
         f.what != "narrow"))
      bad(name, *v, accepts);
    f.rank = static_cast<int>(r);
    f.step = s;
    return f;
  }

private:
  const std::function<const char*(const char*)>& get_;
};

} // namespace

Env parse_env(const std::function<const char*(const char*)>& get) {
  const Reader r(get);
  Env e;
  e.data = r.text("XSERV_DATA").value_or("");
  e.api_key = r.text("XSERV_API_KEY").value_or("");
  e.kernel_cache = r.text("XSERV_KERNEL_CACHE").value_or("");
  e.debug = r.integer("XSERV_DEBUG", 0, 3).value_or(0);
  e.cuda_graphs = r.flag("XSERV_CUDA_GRAPHS").value_or(true);
  e.profile = r.flag("XSERV_PROFILE").value_or(false);
  e.pdl = r.flag("XSERV_PDL").value_or(true);
  if (const auto rep = r.repeat("XSERV_PROFILE_REPEAT")) {
    e.profile_repeat = rep->first;
    e.profile_repeat_times = rep->second;
  }
  e.prefill_chunk = r.integer("XSERV_PREFILL_CHUNK", 8, 65536);
  if (const auto g = r.choice("XSERV_GEMM_PRECISION", {"split", "bf16"}, "split or bf16"))
    e.gemm_split = *g == "split";
  e.pipeline_timeout = r.seconds("XSERV_PIPELINE_TIMEOUT").value_or(e.pipeline_timeout);
  e.pipeline_step_timeout =
      r.seconds("XSERV_PIPELINE_STEP_TIMEOUT").value_or(e.pipeline_step_timeout);
  e.pipeline_micro_batches = r.integer("XSERV_PIPELINE_MICROBATCHES", 1, 4096).value_or(0);
  e.pipeline_transport =
      r.choice("XSERV_PIPELINE_TRANSPORT", {"auto", "tcp", "nccl"}, "auto, tcp or nccl")
          .value_or("auto");
  e.pipeline_token = r.text("XSERV_PIPELINE_TOKEN").value_or("");
  e.pipeline_fault = r.fault("XSERV_PIPELINE_FAULT");
  return e;
}

const Env& env() {
  static const Env e = parse_env([](const char* name) { return std::getenv(name); });
  return e;
}

std::filesystem::path kernel_cache_dir() {
  namespace fs = std::filesystem;
  if (const std::string& d = env().kernel_cache; !d.empty())
    return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d)
    return fs::path(d) / "xserv/kernels";
  if (const char* h = std::getenv("HOME"); h && *h)
    return fs::path(h) / ".cache/xserv/kernels";
  return fs::temp_directory_path() / "xserv-kernels";
}

} // namespace xserv::cli
