// The Coordinator: rank 0's listener, handshakes, worker processes, heartbeats and bounded waits.
#include "engine/pipeline/coordinator.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <optional>
#include <set>
#include <string_view>

#include <fmt/format.h>

#include "engine/pipeline/wire.h"
#include "runtime/plan_io.h"
#include "runtime/sha256.h"

extern char** environ;

namespace xserv::engine::pipeline {
namespace fs = std::filesystem;
using runtime::Connection;
using runtime::Frame;
using Clock = std::chrono::steady_clock;
using namespace wire;

namespace {

runtime::Listener make_listener(const std::string& coordinator) {
  if (coordinator.empty())
    return runtime::Listener("127.0.0.1", 0); // spawned workers are on this host
  const auto [host, port] = runtime::split_address(coordinator, true);
  return runtime::Listener(host, port);
}

} // namespace

Coordinator::Coordinator(const runtime::OpenedPlan& plan, const PipelineOptions& options,
                         const Welcome& welcome, int gpus)
    : plan_(plan), options_(options),
      token_(pipeline_token(options.token, options.coordinator.empty())),
      digest_(pipeline_plan_digest(plan)), listener_(make_listener(options.coordinator)) {
  const int world = static_cast<int>(plan_.plan->stages.size());
  ranks_.resize(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r)
    send_mu_.push_back(std::make_unique<std::mutex>());
  if (options_.coordinator.empty())
    spawn_workers(gpus);
  std::fprintf(stderr, "[pipeline] rank 0 of %d, waiting for %d rank(s) on port %u\n", world,
               world - 1, listener_.port());
  try {
    accept_ranks(welcome);
  } catch (...) { // no destructor runs for a constructor that throws
    shut_down(std::chrono::milliseconds(0));
    throw;
  }
}

Coordinator::~Coordinator() {
  shut_down(std::chrono::seconds(5));
}

void Coordinator::shut_down(std::chrono::milliseconds grace) {
  stop_heartbeats();
  for (size_t r = 1; r < ranks_.size(); ++r)
    if (ranks_[r].valid()) {
      try {
        std::lock_guard<std::mutex> lock(*send_mu_[r]);
        ranks_[r].send(message(kQuit, nlohmann::json::object()));
      } catch (const Error&) {
      }
    }
  for (pid_t pid : children_) {
    int status = 0;
    const auto deadline = Clock::now() + grace;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (Clock::now() >= deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  children_.clear();
}

namespace {

/// How long one joining peer has to prove it holds the token.
constexpr auto kHandshakeTimeout = std::chrono::milliseconds(5000);
/// Handshakes at once; connections past this many are dropped unread.
constexpr size_t kMaxHandshakes = 256;

} // namespace

/// The handshakes of joining peers, each on a thread of its own under its own deadline, so that
/// idle or slow strays cannot use up the connect window of the ranks that come after them.
/// Destroying it cuts the handshakes still running short and joins their threads.
class Coordinator::Handshakes {
public:
  explicit Handshakes(Coordinator& coord) : coord_(coord) {}
  ~Handshakes() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int fd : pending_fds_) // their receive returns at once: the thread ends
        ::shutdown(fd, SHUT_RDWR);
    }
    for (std::thread& t : threads_)
      t.join();
  }
  /// Starts the handshake of `c` (drops it when kMaxHandshakes are running).
  void start(Connection c) {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_fds_.size() >= kMaxHandshakes) {
      std::fprintf(stderr,
                   "[pipeline] dropped a connection from %s: %zu handshakes are already "
                   "running\n",
                   c.peer().c_str(), kMaxHandshakes);
      return;
    }
    const int fd = c.fd_for_tests();
    pending_fds_.insert(fd);
    threads_.emplace_back([this, fd, c = std::move(c)]() mutable { run(fd, std::move(c)); });
  }
  /// The next peer that proved it holds the token, waiting at most `timeout`.
  std::optional<std::pair<Connection, nlohmann::json>> next(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !proven_.empty(); }))
      return std::nullopt;
    auto out = std::move(proven_.front());
    proven_.pop_front();
    return out;
  }

private:
  void run(int fd, Connection c) {
    // Until a peer proves it holds the token, what it sends is only logged: a stray, garbage,
    // idle or unauthenticated connection is dropped and the wait goes on.
    std::optional<nlohmann::json> hello;
    try {
      hello = coord_.authenticate(c);
    } catch (const Error& e) {
      std::fprintf(stderr, "[pipeline] dropped a connection from %s: %s\n", c.peer().c_str(),
                   e.what());
    }
    std::lock_guard<std::mutex> lock(mu_);
    pending_fds_.erase(fd);
    if (hello) {
      proven_.emplace_back(std::move(c), std::move(*hello));
      cv_.notify_all();
    }
  }

  Coordinator& coord_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<int> pending_fds_;
  std::deque<std::pair<Connection, nlohmann::json>> proven_;
  std::vector<std::thread> threads_;
};

void Coordinator::accept_ranks(const Welcome& welcome) {
  const int world = this->world();
  const auto deadline = Clock::now() + options_.connect_timeout;
  Handshakes handshakes(*this);
  for (int got = 0; got < world - 1;) {
    check_children();
    if (Clock::now() >= deadline)
      throw Error(fmt::format("pipeline: {} of {} rank(s) connected within {} s", got, world - 1,
                              options_.connect_timeout.count() / 1000));
    try {
      handshakes.start(
          listener_.accept(std::min(deadline, Clock::now() + std::chrono::milliseconds(20))));
    } catch (const Error&) { // nobody came: look at the finished handshakes
    }
    auto joined = handshakes.next(std::chrono::milliseconds(0));
    if (!joined)
      continue;
    auto& [c, h] = *joined;
    const int rank = h.value("rank", -1);
    std::string refusal;
    if (rank < 1 || rank >= world)
      refusal = fmt::format("rank {} is outside 1..{}", rank, world - 1);
    else if (h.value("world", 0) != world)
      refusal = fmt::format("rank {} was started for {} ranks, this pipeline has {}", rank,
                            h.value("world", 0), world);
    else if (h.value("digest", "") != digest_)
      refusal = fmt::format("rank {} holds a plan from another compile (digest {} vs {})", rank,
                            h.value("digest", "").substr(0, 12), digest_.substr(0, 12));
    else if (ranks_[size_t(rank)].valid())
      refusal = fmt::format("rank {} connected twice", rank);
    if (!refusal.empty()) { // a rank of this run (it holds the token), misconfigured
      c.send(message(kFail, {{"message", refusal}}));
      throw Error("pipeline handshake: " + refusal);
    }
    // The workers size their KV caches and arenas for what this run asked for (--max-batch,
    // --max-seq within the plan's), not the plan's maxima.
    nlohmann::json w = {{"ok", true},
                        {"backend", welcome.backend},
                        {"max_batch", welcome.max_batch},
                        {"max_seq", welcome.max_seq},
                        {"proof", welcome_proof(token_, h["nonce"], rank)}};
    if (!welcome.nccl_id.empty())
      w["nccl_id"] = to_hex(welcome.nccl_id);
    c.send(message(kWelcome, w));
    ranks_[size_t(rank)] = std::move(c);
    ++got;
  }
}

nlohmann::json Coordinator::authenticate(Connection& c) {
  // The handshake of a new connection up to its proof: send a fresh challenge, read a small
  // hello, check its fields' types and its HMAC over the challenge. Anything else throws (the
  // caller drops the connection), after telling an unauthenticated xserv worker why.
  const std::string challenge = to_hex(random_bytes(32));
  c.send(message(kChallenge, {{"nonce", challenge}}));
  const Frame hello = c.receive(kHandshakeTimeout, kMaxHandshakeBytes);
  if (hello.type != kHello)
    throw Error(fmt::format("its first frame is of type {}, not a hello", int(hello.type)));
  const nlohmann::json h = decode(hello.payload, nullptr);
  for (const char* k : {"digest", "nonce", "proof"})
    if (!h.contains(k) || !h[k].is_string())
      throw Error(fmt::format("its hello has no string '{}'", k));
  for (const char* k : {"rank", "world"})
    if (!h.contains(k) || !h[k].is_number_integer() || h[k].get<int64_t>() < 0 ||
        h[k].get<int64_t>() > (1 << 16))
      throw Error(fmt::format("its hello has no valid '{}'", k));
  const std::string want = hello_proof(token_, challenge, h["rank"].get<int>(),
                                       h["world"].get<int>(), h["digest"], h["nonce"]);
  if (!same_digest(h["proof"].get<std::string>(), want)) {
    c.send(message(
        kFail,
        {{"message", "authentication failed: this rank does not hold the "
                     "pipeline token (--pipeline-token or XSERV_PIPELINE_TOKEN) of rank 0"}}));
    throw Error(
        fmt::format("claims rank {} but does not hold the pipeline token", h["rank"].get<int>()));
  }
  return h;
}

void Coordinator::send(int r, const Frame& f) {
  try {
    std::lock_guard<std::mutex> lock(*send_mu_[size_t(r)]);
    ranks_[size_t(r)].send(f);
  } catch (const Error& e) {
    fail(r, e);
  }
}

nlohmann::json Coordinator::await(int r, uint8_t type, Named* tensors, uint64_t max_bytes) {
  // Heartbeats prove a rank alive, not that it progresses: the whole wait is bounded too.
  const auto deadline = Clock::now() + options_.step_timeout;
  try {
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      const auto past_deadline = [&] {
        return Error(fmt::format("no result within the step deadline of {:g} s, only "
                                 "heartbeats (XSERV_PIPELINE_STEP_TIMEOUT)",
                                 double(options_.step_timeout.count()) / 1000));
      };
      if (left.count() <= 0)
        throw past_deadline();
      Frame f;
      try {
        f = ranks_[size_t(r)].receive(std::min(options_.rank_timeout, left),
                                      reply_frame_bound(type, max_bytes));
      } catch (const Error&) {
        if (left < options_.rank_timeout &&
            Clock::now() + std::chrono::milliseconds(10) >= deadline)
          throw past_deadline(); // the deadline, not the rank's silence, cut the wait short
        throw;
      }
      if (f.type == kAlive)
        continue;
      if (f.type == kFail) {
        const nlohmann::json j = decode(f.payload, nullptr);
        const auto m = j.find("message");
        throw Error(m != j.end() && m->is_string()
                        ? m->get<std::string>()
                        : std::string("a pipeline rank sent a malformed failure frame"));
      }
      if (f.type != type)
        throw Error(fmt::format("unexpected message {}", f.type));
      return decode(f.payload, tensors);
    }
  } catch (const Error& e) {
    fail(r, e);
  }
}

void Coordinator::start_heartbeats() {
  beat_ = std::thread([this] { beat_workers(); });
}

void Coordinator::stop_heartbeats() {
  {
    std::lock_guard<std::mutex> lock(beat_mu_);
    beat_done_ = true;
  }
  beat_wake_.notify_one();
  if (beat_.joinable())
    beat_.join();
}

void Coordinator::beat_workers() {
  std::unique_lock<std::mutex> lock(beat_mu_);
  while (!beat_wake_.wait_for(lock, std::chrono::seconds(1), [this] { return beat_done_; }))
    for (size_t r = 1; r < ranks_.size(); ++r) {
      std::lock_guard<std::mutex> g(*send_mu_[r]);
      if (!ranks_[r].valid())
        continue;
      try {
        ranks_[r].send(message(kAlive, nlohmann::json::object()));
      } catch (const Error& e) { // the next await reports it too; lost() says it meanwhile
        if (lost_.empty())
          lost_ = fmt::format("pipeline rank {} stopped: {}", r, e.what());
      }
    }
}

std::string Coordinator::lost() const {
  std::lock_guard<std::mutex> lock(beat_mu_);
  return lost_;
}

void Coordinator::fail(int r, const Error& e) {
  const auto until = Clock::now() + std::chrono::seconds(1);
  do {
    check_children();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } while (child_rank_has(r) && Clock::now() < until);
  if (dynamic_cast<const runtime::FrameRefused*>(&e)) // the rank is there; its frame is not
    throw Error(fmt::format("refused a frame from pipeline rank {}: {}", r, e.what()));
  throw Error(fmt::format("pipeline rank {} stopped: {}", r, e.what()));
}

void Coordinator::spawn_workers(int gpus) {
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  for (int r = 1; r < world(); ++r) {
    std::vector<std::string> argv = {self,
                                     "worker",
                                     plan_.dir.string(),
                                     "--rank",
                                     std::to_string(r),
                                     "--world",
                                     std::to_string(world()),
                                     "--coordinator",
                                     fmt::format("127.0.0.1:{}", listener_.port())};
    if (options_.backend == "cuda") { // one GPU per rank, round robin over the visible ones
      argv.push_back("--device");
      argv.push_back(std::to_string(r % std::max(1, gpus)));
    }
    if (!options_.weights.empty()) {
      argv.push_back("--weights");
      argv.push_back(options_.weights.string());
    }
    std::vector<char*> cargv;
    for (std::string& a : argv)
      cargv.push_back(a.data());
    cargv.push_back(nullptr);
    // The token reaches the workers through their environment, never their command line.
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e)
      if (std::string_view(*e).rfind("XSERV_PIPELINE_TOKEN=", 0) != 0)
        env.emplace_back(*e);
    env.push_back("XSERV_PIPELINE_TOKEN=" + token_);
    std::vector<char*> cenv;
    for (std::string& e : env)
      cenv.push_back(e.data());
    cenv.push_back(nullptr);
    pid_t pid = 0;
    if (::posix_spawn(&pid, self.c_str(), nullptr, nullptr, cargv.data(), cenv.data()) != 0)
      throw Error(fmt::format("cannot start pipeline rank {}: {}", r, std::strerror(errno)));
    children_.push_back(pid);
    child_rank_[pid] = r;
  }
}

bool Coordinator::child_rank_has(int r) const {
  for (pid_t pid : children_)
    if (child_rank_.at(pid) == r)
      return true;
  return false;
}

void Coordinator::check_children() {
  for (pid_t pid : children_) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      const int r = child_rank_.at(pid);
      children_.erase(std::find(children_.begin(), children_.end(), pid));
      throw Error(fmt::format("pipeline rank {} (pid {}) exited{}", r, pid,
                              WIFEXITED(status)
                                  ? fmt::format(" with status {}", WEXITSTATUS(status))
                                  : fmt::format(" on signal {}", WTERMSIG(status))));
    }
  }
}

std::string pipeline_plan_digest(const runtime::OpenedPlan& plan) {
  const runtime::Plan& p = *plan.plan;
  if (!p.pipelined())
    throw Error(fmt::format("{}: not a pipelined plan (compile with --pp N)",
                            (plan.dir / "plan.json").string()));
  runtime::Sha256 h;
  h.update_field(runtime::plan_options_to_json(p.options).dump());
  h.update_field(p.model_digest);
  for (const runtime::PlanStage& s : p.stages)
    h.update_field(p.digests.at(s.graph));
  return h.hex_digest();
}

std::string resolve_transport(const PipelineOptions& o, int world, int gpus, bool nccl_loads,
                              std::string* why) {
  if (o.transport != "auto")
    return o.transport;
  std::string reason;
  if (o.backend != "cuda")
    reason = fmt::format("the {} backend has no GPU buffers to send", o.backend);
  else if (!nccl_loads)
    reason = why && !why->empty() ? *why : "NCCL is not available";
  else if (o.coordinator.empty() && gpus < world)
    reason = fmt::format("{} ranks share {} GPU(s) and NCCL needs a GPU per rank", world, gpus);
  if (why)
    *why = reason;
  return reason.empty() ? "nccl" : "tcp";
}

} // namespace xserv::engine::pipeline
