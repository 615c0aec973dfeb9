// `xserv serve`: load a plan, serve it over OpenAI-compatible HTTP, drain on SIGTERM/SIGINT.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <pthread.h>
#include <thread>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/env.h"
#include "cli/model_source.h"
#include "server/server.h"

namespace xserv::cli {
namespace {

void say(const std::string& line) {
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

/// Blocks SIGTERM and SIGINT in this thread and in every thread it starts later, so that only
/// sigwait() sees them.
sigset_t block_stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::signal(SIGPIPE, SIG_IGN); // a client gone mid-write is an error return, not a kill
  return set;
}

/// A flag's seconds as a positive duration (UsageError otherwise).
std::chrono::milliseconds seconds_flag(const ParsedArgs& args, const char* name, double fallback) {
  const double s = args.get_double(name, fallback);
  if (!(s > 0) || s > 86400 * 365)
    throw UsageError(fmt::format("{} must be a number of seconds above 0", name));
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(s * 1000.0)));
}

/// How long a server whose model broke keeps answering 503 (so health checks and clients see
/// why) before it exits 1 for its supervisor to restart it.
constexpr auto kBrokenLinger = std::chrono::seconds(2);
/// `serve`'s default --itl-factor (cmd_serve below says why).
constexpr double kServeItlFactor = 3.0;

} // namespace

int cmd_serve(const ParsedArgs& args) {
  server::ServeOptions opt;
  opt.model_name = args.get("--served-model-name", "gpt-oss");
  opt.api_key = args.get("--api-key");
  if (opt.api_key.empty())
    opt.api_key = env().api_key;
  opt.metrics_public = args.has("--metrics-public");
  opt.engine.max_running = args.get_int("--max-running", 0, 0, 1 << 20);
  opt.engine.max_queue = args.get_int("--max-queue", 4096, 0, 1 << 24);
  opt.engine.max_tokens_per_step = args.get_int("--max-tokens-per-step", 8192, 1, 1 << 24);
  // A server's decodes wait at most ~3x their step for prompts (H100, 20b, 1,024 x (512 + 256)
  // at c256: ITL p99 189 -> 53-57 ms for -2% tok/s, TTFT p99 unchanged; docs/PERF.md "At
  // scale"). Offline commands keep the arrival-ordered schedule, independent of step times.
  opt.engine.itl_factor = kServeItlFactor;
  engine_kv_options(args, opt.engine);
  opt.max_json_depth = static_cast<int>(args.get_int("--max-json-depth", 64, 1, 10000));
  server::ConnectionLimits& c = opt.connections;
  c.max_body_bytes = parse_size(args.get("--max-body", "16MiB"), "--max-body");
  c.max_connections = static_cast<size_t>(args.get_int("--max-connections", 8192, 1, 1 << 24));
  c.max_per_client =
      static_cast<size_t>(args.get_int("--max-connections-per-client", 512, 0, 1 << 24));
  c.header_timeout = seconds_flag(args, "--header-timeout", 10);
  c.body_timeout = seconds_flag(args, "--body-timeout", 60);
  c.idle_timeout = seconds_flag(args, "--keep-alive-timeout", 30);
  c.write_timeout = seconds_flag(args, "--write-timeout", 60);
  opt.io_threads = static_cast<int>(args.get_int("--http-threads", 2, 1, 256));
  const std::string host = args.get("--host", "127.0.0.1");
  const int port = static_cast<int>(args.get_int("--port", 8000, 0, 65535));
  const auto grace =
      std::chrono::milliseconds(static_cast<int64_t>(args.get_double("--grace", 30.0) * 1000.0));
  if (grace.count() < 0)
    throw UsageError("--grace must be >= 0 seconds");

  ModelSource src = resolve_source(args.positional()[0], args);
  const sigset_t stop_signals = block_stop_signals();
  std::atomic<int> signal_seen{0};
  std::atomic<bool> loaded{false};
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    signal_seen = sig;
    if (!loaded) {
      say(fmt::format("[serve] signal {} while loading: exiting", sig));
      std::_Exit(0);
    }
  });
  waiter.detach();

  server::Server server(opt);
  const int bound = server.listen(host, port);
  say(fmt::format("[serve] listening on http://{}:{} (loading the model; /health is 503)", host,
                  bound));
  Progress progress("serve");
  progress.step("loading the tokenizer");
  models::Tokenizer tok = load_tokenizer(src, args);
  progress.finish();
  progress.step(fmt::format("loading {}", args.positional()[0]));
  std::unique_ptr<engine::Model> model = make_model(src, args);
  progress.finish(fmt::format("{} backend, {} rows of {} tokens", model->backend(),
                              model->max_batch(), model->max_seq()));
  server.attach(*model, tok);
  loaded = true;
  say(fmt::format("[serve] ready: model '{}' at http://{}:{}/v1", opt.model_name, host, bound));
  std::string broken;
  while (signal_seen == 0 && (broken = server.broken()).empty())
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (!broken.empty()) {
    // Nothing in this process can mend a pipeline that lost a rank: exit non-zero so that a
    // supervisor (systemd Restart=on-failure, a Kubernetes restart policy) starts it afresh.
    say(fmt::format("[serve] the model is broken ({}); /health answers 503; exiting with "
                    "status 1 in {} s",
                    broken, std::chrono::duration<double>(kBrokenLinger).count()));
    for (auto until = std::chrono::steady_clock::now() + kBrokenLinger;
         signal_seen == 0 && std::chrono::steady_clock::now() < until;)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    server.drain(std::chrono::milliseconds(0));
    say("[serve] stopped: the model is broken");
    return 1;
  }
  say(fmt::format("[serve] signal {}: draining (grace {:.1f} s)", signal_seen.load(),
                  grace.count() / 1e3));
  server.drain(grace);
  const auto st = server.stats();
  say(fmt::format("[serve] stopped: {} prompt and {} generated tokens served", st.prompt_tokens,
                  st.generated_tokens));
  return 0;
}

} // namespace xserv::cli
