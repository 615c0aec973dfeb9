// The multi-process pipeline, rank 0's side: PipelineModel spawns or awaits the workers
// (cli/pipeline_worker.cpp), sends each the step (token ids, context lengths, cache rows) and the
// activations its stage receives, and gets back what it sends on (the last rank: the logits or
// the greedy ids), over the frames of cli/pipeline_wire.h; with NCCL the activations go GPU to
// GPU instead. A engine::StageRunner runs one stage's program on the CPU interpreter or on this
// process's GPU.
#include "cli/pipeline.h"
#include "cli/env.h"
#include "cli/loaded_plan.h"
#include "cli/pipeline_wire.h"
#include "engine/pipeline_stage.h"
#include "runtime/plan_io.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/cpu_model.h"
#include "ir/error.h"
#include "models/gpt_oss.h"
#include "models/step.h"
#include "runtime/device.h"
#include "runtime/nccl.h"
#include "runtime/net.h"
#include "runtime/sha256.h"

extern char** environ;

namespace xserv::cli {
namespace fs = std::filesystem;
using runtime::Connection;
using runtime::Frame;
using Clock = std::chrono::steady_clock;
using namespace wire;

namespace {

class PipelineModel : public Model {
public:
  PipelineModel(const ModelSource& src, const PipelineLaunch& launch)
      : src_(src), launch_(launch), max_batch_(src.max_batch), max_seq_(src.max_seq),
        token_(pipeline_token(launch.token, launch.coordinator.empty())),
        listener_(
            launch.coordinator.empty()
                ? runtime::Listener("127.0.0.1", 0) // spawned workers are on this host
                : runtime::Listener(runtime::split_address(launch.coordinator, true).first,
                                    runtime::split_address(launch.coordinator, true).second)) {
    const int world = static_cast<int>(src_.plan->stages.size());
    const std::string digest = pipeline_plan_digest(src_.plan_dir);
    std::string why;
    const bool cuda = launch.backend == "cuda";
    const int gpus = cuda ? runtime::probe_device().count : 0;
    const std::string transport =
        resolve_transport(launch, world, gpus, cuda && runtime::nccl_available(&why), &why);
    const bool nccl = transport == "nccl";
    if (launch.transport == "auto" && !nccl && cuda)
      std::fprintf(stderr, "[pipeline] activations over TCP: %s\n", why.c_str());
    if (nccl && launch.backend != "cuda")
      throw Error("the NCCL transport moves activations between GPUs: it needs --backend cuda");
    const std::string nccl_id = nccl ? runtime::nccl_unique_id() : std::string();
    if (launch.coordinator.empty())
      spawn_workers(src_.plan_dir, world, gpus);
    std::fprintf(stderr, "[pipeline] rank 0 of %d, waiting for %d rank(s) on port %u\n", world,
                 world - 1, listener_.port());
    ranks_.resize(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r)
      send_mu_.push_back(std::make_unique<std::mutex>());
    const auto deadline = Clock::now() + launch.connect_timeout;
    for (int got = 0; got < world - 1;) {
      check_children();
      Connection c;
      try {
        c = listener_.accept(std::min(deadline, Clock::now() + std::chrono::milliseconds(500)));
      } catch (const Error&) {
        if (Clock::now() >= deadline)
          throw Error(fmt::format("pipeline: {} of {} rank(s) connected within {} s", got,
                                  world - 1, launch.connect_timeout.count() / 1000));
        continue;
      }
      // Until a peer proves it holds the token, what it sends is only logged: a stray,
      // garbage, idle or unauthenticated connection is dropped and the wait goes on.
      nlohmann::json h;
      try {
        h = authenticate(c);
      } catch (const Error& e) {
        std::fprintf(stderr, "[pipeline] dropped a connection from %s: %s\n", c.peer().c_str(),
                     e.what());
        continue;
      }
      const int rank = h.value("rank", -1);
      std::string refusal;
      if (rank < 1 || rank >= world)
        refusal = fmt::format("rank {} is outside 1..{}", rank, world - 1);
      else if (h.value("world", 0) != world)
        refusal = fmt::format("rank {} was started for {} ranks, this pipeline has {}", rank,
                              h.value("world", 0), world);
      else if (h.value("digest", "") != digest)
        refusal = fmt::format("rank {} holds a plan from another compile (digest {} vs {})", rank,
                              h.value("digest", "").substr(0, 12), digest.substr(0, 12));
      else if (ranks_[size_t(rank)].valid())
        refusal = fmt::format("rank {} connected twice", rank);
      if (!refusal.empty()) { // a rank of this run (it holds the token), misconfigured
        c.send(message(kFail, {{"message", refusal}}));
        throw Error("pipeline handshake: " + refusal);
      }
      // The workers size their KV caches and arenas for what this run asked for (--max-batch,
      // --max-seq within the plan's), not the plan's maxima.
      nlohmann::json welcome = {{"ok", true},
                                {"backend", launch.backend},
                                {"max_batch", max_batch_},
                                {"max_seq", max_seq_},
                                {"proof", welcome_proof(token_, h["nonce"], rank)}};
      if (nccl)
        welcome["nccl_id"] = to_hex(nccl_id);
      c.send(message(kWelcome, welcome));
      ranks_[size_t(rank)] = std::move(c);
      ++got;
    }
    // From now on every worker hears from rank 0 at least once a second, so a frozen rank 0
    // ends the workers' runs (XSERV_PIPELINE_TIMEOUT) instead of leaving them waiting.
    beat_ = std::thread([this] { beat_workers(); });
    try {
      // Rank 0's own stage loads while the workers load theirs; then each reports ready.
      local_ = make_stage_runner(src_, 0, launch.backend, max_batch_, max_seq_);
      for (int r = 1; r < world; ++r)
        await(r, kReady, nullptr);
      if (nccl) { // every rank joins the communicator once its stage is loaded
        comm_ = std::make_unique<runtime::NcclComm>(nccl_id, world, 0, launch.connect_timeout);
        comm_->connect_pipeline(launch.connect_timeout); // not in the first step
        local_->use_nccl(comm_.get(), 0, nccl_step_timeout(launch.rank_timeout));
      }
    } catch (...) {
      stop_beat(); // no destructor runs for a constructor that throws
      throw;
    }
    std::fprintf(stderr, "[pipeline] %d ranks ready (%s, activations over %s)\n", world,
                 launch.backend.c_str(), nccl ? "NCCL" : "TCP");
  }

  ~PipelineModel() override {
    stop_beat();
    for (size_t r = 1; r < ranks_.size(); ++r)
      if (ranks_[r].valid()) {
        try {
          send_to(int(r), message(kQuit, nlohmann::json::object()));
        } catch (const Error&) {
        }
      }
    for (pid_t pid : children_) {
      int status = 0;
      const auto deadline = Clock::now() + std::chrono::seconds(5);
      while (::waitpid(pid, &status, WNOHANG) == 0) {
        if (Clock::now() > deadline) {
          ::kill(pid, SIGKILL);
          ::waitpid(pid, &status, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }

  const models::ModelConfig& config() const override { return local_->config(); }
  int64_t max_batch() const override { return max_batch_; }
  int64_t max_seq() const override { return max_seq_; }
  std::string backend() const override { return launch_.backend; }

  std::vector<std::vector<float>> step(const models::StepInput& in) override {
    std::vector<std::vector<float>> logits(in.tokens.size());
    run_ranks(in, false, &logits, nullptr);
    return logits;
  }

  /// The last rank picks the greedy tokens and sends back only them.
  std::vector<int32_t> step_greedy(const models::StepInput& in) override {
    if (src_.plan->stages.size() == 1)
      return Model::step_greedy(in);
    std::vector<int32_t> ids(in.tokens.size());
    run_ranks(in, true, nullptr, &ids);
    return ids;
  }

  void reset() override {
    local_->reset();
    for (size_t r = 1; r < ranks_.size(); ++r)
      send_to(int(r), message(kReset, nlohmann::json::object()));
  }

private:
  /// One step through every rank as micro-batches on a pipeline schedule: at tick t rank r
  /// works on micro-batch t - r, which rank r - 1 finished at tick t - 1 (rank 0 relays the
  /// activations). Rank 0 sends the workers their inputs first, then runs stage 0, then
  /// collects; the last rank's results give each sequence's logits row (or, with `greedy`,
  /// its id).
  void run_ranks(const models::StepInput& in, bool greedy, std::vector<std::vector<float>>* logits,
                 std::vector<int32_t>* ids) {
    maybe_fault(0, steps_); // tests: "0:stop@STEP" freezes rank 0 here
    if (static_cast<int64_t>(in.tokens.size()) > max_batch_)
      throw Error(fmt::format("{} sequences in one step exceed the maximum batch of {}",
                              in.tokens.size(), max_batch_));
    const int world = static_cast<int>(src_.plan->stages.size());
    const auto tokens = static_cast<size_t>(token_count(in));
    bool prompt = false;
    for (const auto& t : in.tokens)
      prompt = prompt || t.size() > 1;
    const std::vector<engine::MicroBatch> mbs = engine::micro_batches(
        in, pipeline_micro_batches(launch_.micro_batches, tokens, prompt, world));
    const int m_count = static_cast<int>(mbs.size());
    if (comm_) {
      run_ranks_nccl(mbs, greedy, logits, ids);
      return;
    }
    // out[r][m]: what rank r sent on for micro-batch m, until rank r + 1 has it.
    std::vector<std::vector<Named>> out(size_t(world), std::vector<Named>(mbs.size()));
    for (int t = 0; t < m_count + world - 1; ++t) {
      for (int r = 1; r < world; ++r) {
        const int m = t - r;
        if (m < 0 || m >= m_count)
          continue;
        const nlohmann::json head = step_header(mbs[size_t(m)].in, steps_, greedy);
        try {
          send_to(r, message(kStep, head, out[size_t(r - 1)][size_t(m)]));
        } catch (const Error& e) {
          fail(r, e);
        }
        out[size_t(r - 1)][size_t(m)].clear();
      }
      if (t < m_count)
        out[0][size_t(t)] = local_->run(mbs[size_t(t)].in, {});
      for (int r = 1; r < world; ++r) {
        const int m = t - r;
        if (m < 0 || m >= m_count)
          continue;
        Named& got = out[size_t(r)][size_t(m)];
        const bool last = r == world - 1;
        const std::vector<BoundaryTensor> sends =
            last ? std::vector<BoundaryTensor>()
                 : stage_sends(src_.plan->stages[size_t(r)], token_count(mbs[size_t(m)].in));
        const nlohmann::json head = await(r, kResult, &got,
                                          result_frame_bytes(mbs[size_t(m)].in, sends, last, greedy,
                                                             local_->config().vocab_size));
        if (last)
          take_results(r, mbs[size_t(m)], head, got, logits, ids);
        else // relayed to rank r + 1 next tick: first checked against the plan's boundary
          check_boundary(got, sends, fmt::format("pipeline rank {}", r));
      }
    }
    ++steps_;
  }

  /// run_ranks with the activations moving rank to rank over NCCL: every worker gets all the
  /// step's micro-batch headers at once (a rank's receive must be posted while the previous
  /// rank sends), rank 0 runs its micro-batches (each sent on to rank 1 on the device), then
  /// collects every rank's acknowledgements and the last rank's results.
  void run_ranks_nccl(const std::vector<engine::MicroBatch>& mbs, bool greedy,
                      std::vector<std::vector<float>>* logits, std::vector<int32_t>* ids) {
    const int world = static_cast<int>(src_.plan->stages.size());
    for (int r = 1; r < world; ++r)
      for (const engine::MicroBatch& mb : mbs) {
        const nlohmann::json head = step_header(mb.in, steps_, greedy);
        try {
          send_to(r, message(kStep, head));
        } catch (const Error& e) {
          fail(r, e);
        }
      }
    try {
      for (const engine::MicroBatch& mb : mbs)
        local_->run(mb.in, {});
    } catch (const Error&) { // usually a rank that stopped: say which, if one of ours did
      check_children();
      throw;
    }
    for (int r = 1; r < world; ++r)
      for (const engine::MicroBatch& mb : mbs) {
        Named got; // over NCCL an intermediate rank's result is an acknowledgement
        const nlohmann::json head = await(
            r, kResult, &got,
            result_frame_bytes(mb.in, {}, r == world - 1, greedy, local_->config().vocab_size));
        if (r == world - 1)
          take_results(r, mb, head, got, logits, ids);
      }
    ++steps_;
  }

  /// The last rank's reply for micro-batch `mb`: each piece that ends its sequence gives that
  /// sequence's logits row (the stage returns one row per piece, or per token with
  /// --all-logits) or greedy id.
  /// The last rank's answer for `mb`, checked against what the step asked for before use: one id
  /// per sequence inside the vocabulary, or one float logits tensor of [sequences or tokens,
  /// vocabulary].
  void take_results(int r, const engine::MicroBatch& mb, const nlohmann::json& head,
                    const Named& got, std::vector<std::vector<float>>* logits,
                    std::vector<int32_t>* ids) {
    const int64_t vocab = local_->config().vocab_size;
    auto bad = [&](const std::string& what) {
      return Error(fmt::format("pipeline rank {} sent a malformed result: {}", r, what));
    };
    if (ids) {
      const auto it = head.find("ids");
      if (it == head.end() || !it->is_array() || it->size() != mb.seq.size())
        throw bad(fmt::format("expected {} ids", mb.seq.size()));
      for (const auto& id : *it) // kNonFinite: the last rank's logits row was not finite
        if (!id.is_number_integer() ||
            (id.get<int64_t>() < 0 && id.get<int64_t>() != engine::kNonFinite) ||
            id.get<int64_t>() >= vocab)
          throw bad(fmt::format("id {} is outside the vocabulary of {}", id.dump(), vocab));
      const std::vector<int32_t> picked = it->get<std::vector<int32_t>>();
      for (size_t i = 0; i < mb.seq.size(); ++i)
        if (mb.last[i])
          (*ids)[mb.seq[i]] = picked.at(i);
      return;
    }
    const auto tokens = static_cast<size_t>(token_count(mb.in));
    if (got.size() != 1 || got[0].second.is_int() || got[0].second.shape.size() != 2 ||
        got[0].second.shape[1] != vocab ||
        (got[0].second.shape[0] != static_cast<int64_t>(mb.in.tokens.size()) &&
         got[0].second.shape[0] != static_cast<int64_t>(tokens)))
      throw bad(fmt::format("expected one float logits tensor of [{} or {}, {}]",
                            mb.in.tokens.size(), tokens, vocab));
    std::vector<std::vector<float>> rows =
        engine::sequence_logits(got.at(0).second, mb.in.tokens.size(),
                                models::step_params(mb.in).at(models::params::kLogitRows));
    for (size_t i = 0; i < mb.seq.size(); ++i)
      if (mb.last[i])
        (*logits)[mb.seq[i]] = std::move(rows[i]);
  }

  /// Waits for a frame of `type` from rank `r` (heartbeats extend the wait), decoding its
  /// tensors into `tensors` and returning its header; a failure, a silence past the rank timeout,
  /// a dropped connection or a frame announcing more than `max_bytes` throws naming the rank.
  nlohmann::json await(int r, uint8_t type, Named* tensors, uint64_t max_bytes = kMaxControlBytes) {
    // Heartbeats prove a rank alive, not that it progresses: the whole wait is bounded too.
    const auto deadline = Clock::now() + step_timeout_;
    try {
      for (;;) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
        const auto past_deadline = [&] {
          return Error(fmt::format("no result within the step deadline of {:g} s, only "
                                   "heartbeats (XSERV_PIPELINE_STEP_TIMEOUT)",
                                   double(step_timeout_.count()) / 1000));
        };
        if (left.count() <= 0)
          throw past_deadline();
        Frame f;
        try {
          f = ranks_[size_t(r)].receive(std::min(launch_.rank_timeout, left),
                                        reply_frame_bound(type, max_bytes));
        } catch (const Error&) {
          if (left < launch_.rank_timeout &&
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

  /// The handshake of a new connection up to its proof: send a fresh challenge, read a small
  /// hello, check its fields' types and its HMAC over the challenge. Returns the hello; throws
  /// (the caller drops the connection) for anything else, after telling an unauthenticated
  /// xserv worker why.
  nlohmann::json authenticate(Connection& c) {
    const std::string challenge = to_hex(random_bytes(32));
    c.send(message(kChallenge, {{"nonce", challenge}}));
    const Frame hello = c.receive(std::chrono::milliseconds(5000), kMaxHandshakeBytes);
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

  /// Sends `f` to rank `r` (serialised with the heartbeat thread's sends).
  void send_to(int r, const Frame& f) {
    std::lock_guard<std::mutex> lock(*send_mu_[size_t(r)]);
    ranks_[size_t(r)].send(f);
  }

  void stop_beat() {
    {
      std::lock_guard<std::mutex> lock(beat_mu_);
      beat_done_ = true;
    }
    beat_wake_.notify_one();
    if (beat_.joinable())
      beat_.join();
  }

  /// The heartbeat thread: kAlive to every connected worker each second until the destructor.
  void beat_workers() {
    std::unique_lock<std::mutex> lock(beat_mu_);
    while (!beat_wake_.wait_for(lock, std::chrono::seconds(1), [this] { return beat_done_; }))
      for (size_t r = 1; r < ranks_.size(); ++r) {
        std::lock_guard<std::mutex> g(*send_mu_[r]);
        if (!ranks_[r].valid())
          continue;
        try {
          ranks_[r].send(message(kAlive, nlohmann::json::object()));
        } catch (const Error&) { // a dead rank is reported by the next await
        }
      }
  }

  [[noreturn]] void fail(int r, const Error& e) {
    // A rank this process started and whose connection dropped is usually exiting: give it a
    // moment, so the message can say how it ended.
    const auto until = Clock::now() + std::chrono::seconds(1);
    do {
      check_children();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    } while (child_rank_has(r) && Clock::now() < until);
    if (dynamic_cast<const runtime::FrameRefused*>(&e)) // the rank is there; its frame is not
      throw Error(fmt::format("refused a frame from pipeline rank {}: {}", r, e.what()));
    throw Error(fmt::format("pipeline rank {} stopped: {}", r, e.what()));
  }

  void spawn_workers(const fs::path& plan_dir, int world, int gpus) {
    const std::string self = fs::read_symlink("/proc/self/exe").string();
    for (int r = 1; r < world; ++r) {
      std::vector<std::string> argv = {self,
                                       "worker",
                                       plan_dir.string(),
                                       "--rank",
                                       std::to_string(r),
                                       "--world",
                                       std::to_string(world),
                                       "--coordinator",
                                       fmt::format("127.0.0.1:{}", listener_.port())};
      if (launch_.backend == "cuda") { // one GPU per rank, round robin over the visible ones
        argv.push_back("--device");
        argv.push_back(std::to_string(r % std::max(1, gpus)));
      }
      if (!launch_.weights.empty()) {
        argv.push_back("--weights");
        argv.push_back(launch_.weights.string());
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

  /// Whether rank `r` is a worker this process started that has not been reaped.
  bool child_rank_has(int r) const {
    for (pid_t pid : children_)
      if (child_rank_.at(pid) == r)
        return true;
    return false;
  }

  /// Throws naming the rank when a spawned worker has exited.
  void check_children() {
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

  ModelSource src_; ///< the pipelined plan, and this run's sizes
  PipelineLaunch launch_;
  int64_t max_batch_, max_seq_;
  std::string token_; ///< the shared secret every rank proves it holds
  /// The most one wait for a rank's answer may take, heartbeats or not.
  std::chrono::milliseconds step_timeout_ = pipeline_step_timeout();
  runtime::Listener listener_;
  std::unique_ptr<engine::StageRunner> local_; ///< stage 0, made after the handshake
  std::unique_ptr<runtime::NcclComm> comm_;    ///< with the NCCL transport
  std::vector<Connection> ranks_;
  std::vector<std::unique_ptr<std::mutex>> send_mu_; ///< per rank: main thread vs heartbeats
  std::mutex beat_mu_;
  std::condition_variable beat_wake_;
  bool beat_done_ = false;
  std::thread beat_; ///< started once every rank has connected
  std::vector<pid_t> children_;
  std::map<pid_t, int> child_rank_;
  int64_t steps_ = 0;
};

} // namespace

std::string resolve_transport(const PipelineLaunch& launch, int world, int gpus, bool nccl_loads,
                              std::string* why) {
  if (launch.transport != "auto")
    return launch.transport;
  std::string reason;
  if (launch.backend != "cuda")
    reason = fmt::format("the {} backend has no GPU buffers to send", launch.backend);
  else if (!nccl_loads)
    reason = why && !why->empty() ? *why : "NCCL is not available";
  else if (launch.coordinator.empty() && gpus < world)
    reason = fmt::format("{} ranks share {} GPU(s) and NCCL needs a GPU per rank", world, gpus);
  if (why)
    *why = reason;
  return reason.empty() ? "nccl" : "tcp";
}

int pipeline_micro_batches(int requested, size_t tokens, bool prompt, int world) {
  if (requested > 0)
    return requested;
  return prompt && tokens >= size_t(2 * world) ? world : 1;
}

std::chrono::milliseconds pipeline_step_timeout() {
  return env().pipeline_step_timeout;
}

std::chrono::milliseconds pipeline_rank_timeout() {
  return env().pipeline_timeout;
}

std::string pipeline_plan_digest(const fs::path& plan_dir) {
  // The plan resolve_source read, whose stage programs verify_plan_files held to these digests.
  const std::shared_ptr<const runtime::Plan> plan = loaded_plan(plan_dir);
  if (!plan->pipelined())
    throw Error(fmt::format("{}: not a pipelined plan (compile with --pp N)",
                            (plan_dir / "plan.json").string()));
  runtime::Sha256 h;
  h.update_field(runtime::plan_options_to_json(plan->options).dump());
  h.update_field(plan->model_digest);
  for (const runtime::PlanStage& s : plan->stages)
    h.update_field(plan->digests.at(s.graph));
  return h.hex_digest();
}

std::unique_ptr<Model> make_pipeline_model(const ModelSource& src, const PipelineLaunch& launch) {
  return std::make_unique<PipelineModel>(src, launch);
}

} // namespace xserv::cli
