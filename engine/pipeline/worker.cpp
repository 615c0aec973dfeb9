// `xserv worker`: pipeline rank R > 0. It joins rank 0 over TCP (the plan's digest in the
// handshake), loads its stage, joins NCCL when rank 0 offers it, then runs each step rank 0
// sends until told to quit, with heartbeats while it computes.
#include "engine/pipeline/worker.h"

#include <algorithm>
#include <memory>
#include <mutex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "engine/pipeline/coordinator.h"
#include "engine/pipeline/stage.h"
#include "engine/pipeline/wire.h"
#include "engine/step_split.h"
#include "runtime/nccl.h"
#include "runtime/net.h"

namespace xserv::engine::pipeline {
namespace fs = std::filesystem;
using runtime::Connection;
using runtime::Frame;
using Clock = std::chrono::steady_clock;
using namespace wire;

int run_worker(const runtime::OpenedPlan& plan, int rank, int world, const PipelineOptions& options,
               const CudaModelOptions& cuda, const runtime::RunSettings& settings) {
  const fs::path& plan_dir = plan.dir;
  const std::string& coordinator = options.coordinator;
  if (world != static_cast<int>(plan.plan->stages.size()))
    throw Error(fmt::format("--world {} but the plan has {} pipeline stages", world,
                            plan.plan->stages.size()));
  if (rank < 1 || rank >= world)
    throw Error(fmt::format("--rank {} is outside 1..{} (rank 0 is `xserv run`)", rank, world - 1));
  const int64_t plan_batch = plan.plan->options.max_batch, plan_seq = plan.plan->options.max_seq;
  if (plan_batch < 1 || plan_seq < 1)
    throw Error(fmt::format("{}: max_batch {} and max_seq {} must be positive",
                            (plan_dir / "plan.json").string(), plan_batch, plan_seq));
  const std::string token = pipeline_token(options.token, false);
  Connection c = Connection::connect(coordinator, Clock::now() + std::chrono::seconds(30));
  // Rank 0 speaks first with a challenge; the hello proves this rank holds the token, and the
  // welcome proves rank 0 does (over this rank's own nonce).
  const Frame ch = c.receive(std::chrono::seconds(30), kMaxHandshakeBytes);
  const nlohmann::json challenge = ch.type == kChallenge ? decode(ch.payload, nullptr) : nullptr;
  if (!challenge.is_object() || !challenge.contains("nonce") || !challenge["nonce"].is_string())
    throw Error(fmt::format("{} did not open an xserv pipeline handshake", coordinator));
  const std::string digest = pipeline_plan_digest(plan), nonce = to_hex(random_bytes(32));
  c.send(message(kHello,
                 {{"rank", rank},
                  {"world", world},
                  {"digest", digest},
                  {"nonce", nonce},
                  {"proof", hello_proof(token, challenge["nonce"], rank, world, digest, nonce)}}));
  const Frame w = c.receive(std::chrono::seconds(30), kMaxHandshakeBytes);
  if (w.type == kFail) {
    const nlohmann::json j = decode(w.payload, nullptr);
    const auto m = j.find("message");
    throw Error("refused by rank 0: " + (m != j.end() && m->is_string()
                                             ? m->get<std::string>()
                                             : std::string("(a malformed failure frame)")));
  }
  if (w.type != kWelcome)
    throw Error("rank 0 answered the handshake with something else");
  const nlohmann::json welcome = decode(w.payload, nullptr);
  if (!welcome.contains("proof") || !welcome["proof"].is_string() ||
      !same_digest(welcome["proof"].get<std::string>(), welcome_proof(token, nonce, rank)))
    throw Error(fmt::format("{} did not prove it holds the pipeline token (--pipeline-token or "
                            "XSERV_PIPELINE_TOKEN)",
                            coordinator));
  for (const char* k : {"max_batch", "max_seq"})
    if (welcome.contains(k) && !welcome[k].is_number_integer())
      throw Error(fmt::format("rank 0's welcome: '{}' is not an integer", k));
  if (welcome.contains("backend") && !welcome["backend"].is_string())
    throw Error("rank 0's welcome: 'backend' is not a string");
  const std::string backend = welcome.value("backend", "cpu");
  // Sizes beyond the plan's are refused, not clamped: rank 0 and this rank must agree on them.
  auto size_of = [&](const char* key, int64_t plan_max) {
    const int64_t v = welcome.value(key, plan_max);
    if (v >= 1 && v <= plan_max)
      return v;
    const std::string why = fmt::format("rank {}: rank 0's welcome asks for {} {}, outside the "
                                        "plan's 1..{} ({})",
                                        rank, key, v, plan_max, (plan_dir / "plan.json").string());
    c.send(message(kFail, {{"message", why}}));
    throw Error(why);
  };
  const int64_t max_batch = size_of("max_batch", plan_batch);
  const int64_t max_seq = size_of("max_seq", plan_seq);
  const runtime::PlanStage& stage = plan.plan->stages.at(size_t(rank));
  std::mutex send_lock;
  std::unique_ptr<StageRunner> engine;
  try {
    Heartbeat alive(c, send_lock); // loading a stage onto a GPU takes seconds
    engine = make_plan_stage(plan, size_t(rank), backend, max_batch, max_seq, cuda, settings);
  } catch (const Error& e) {
    c.send(message(
        kFail, {{"message", fmt::format("rank {} cannot load its stage: {}", rank, e.what())}}));
    throw;
  }
  // Ready, with the pools this rank's memory gave: rank 0 pages every stage within the
  // smallest.
  c.send(message(kReady, {{"kv_blocks", engine->kv_geometry().blocks},
                          {"window_blocks", engine->kv_geometry().window_blocks}}));
  std::unique_ptr<runtime::NcclComm> comm;
  if (welcome.contains("nccl_id")) { // joins with the other ranks; rank 0 joins last
    try {
      comm = std::make_unique<runtime::NcclComm>(from_hex(welcome["nccl_id"].get<std::string>()),
                                                 world, rank, std::chrono::seconds(60));
      comm->connect_pipeline(std::chrono::seconds(60));
      engine->use_nccl(comm.get(), rank, nccl_step_timeout(options.rank_timeout));
    } catch (const Error& e) {
      c.send(message(kFail, {{"message", e.what()}}));
      throw;
    }
  }
  // No frame may announce more than the largest step this rank accepts (checked before
  // anything is allocated), even from a peer that holds the token.
  const runtime::FrameBound bound = worker_frame_bound(stage, max_batch, max_seq);
  for (;;) {
    // Between steps rank 0 may be idle for long (a chat), but it sends a heartbeat every
    // second: silence past the rank timeout means it is frozen or gone.
    Frame f;
    try {
      f = c.receive(options.rank_timeout, bound);
    } catch (const runtime::FrameRefused& e) {
      throw Error(fmt::format("rank {}: refused a frame from rank 0 ({}): {}", rank, coordinator,
                              e.what()));
    } catch (const Error& e) {
      throw Error(fmt::format("rank {}: rank 0 ({}) stopped: {}", rank, coordinator, e.what()));
    }
    if (f.type == kAlive)
      continue;
    if (f.type == kQuit)
      return 0;
    if (f.type == kReset) {
      engine->reset();
      continue;
    }
    if (f.type != kStep)
      throw Error(fmt::format("rank {}: unexpected message {} from rank 0", rank, f.type));
    Named in;
    const nlohmann::json h = decode(f.payload, &in);
    const int64_t step =
        h.contains("step") && h["step"].is_number_integer() ? h["step"].get<int64_t>() : -1;
    maybe_fault(options.fault, rank, step);
    Named out;
    nlohmann::json reply = nlohmann::json::object();
    std::string failure;
    try {
      // The step and its activations are checked against the plan's stage before the stage
      // reads them: sizes within what this rank loaded, each received tensor of the dtype and
      // shape the plan's boundary carries for the step's tokens.
      const models::StepInput step_in = step_from_header(h);
      validate_step(step_in, max_batch, max_seq, engine->config().vocab_size,
                    engine->kv_geometry());
      check_boundary(in, stage_receives(stage, token_count(step_in)),
                     rank == 1 ? std::string("pipeline rank 0")
                               : fmt::format("pipeline rank 0 (relaying rank {})", rank - 1));
      const bool greedy =
          h.contains("greedy") && h["greedy"].is_boolean() && h["greedy"].get<bool>();
      Heartbeat alive(c, send_lock);
      maybe_stall(options.fault, rank, step);
      if (rank + 1 == world && greedy) // the last stage: only the ids go back
        reply["ids"] = engine->run_greedy(step_in, in);
      else
        out = engine->run(step_in, in);
    } catch (const Error& e) {
      failure = e.what();
    }
    std::lock_guard<std::mutex> g(send_lock);
    if (!failure.empty()) {
      c.send(message(kFail, {{"message", failure}}));
      throw Error(failure);
    }
    maybe_corrupt(options.fault, rank, step, out, reply);
    c.send(message(kResult, reply, out));
  }
}

} // namespace xserv::engine::pipeline
