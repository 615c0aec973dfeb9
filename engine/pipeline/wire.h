// The pipeline's wire protocol between rank 0 (coordinator.cpp, pipeline_model.cpp) and the
// workers (worker.cpp): frames of a JSON header (kind, step, tensor names, dtypes, shapes)
// followed by the tensors' bytes, the step inputs inside a header, the NCCL id as hex, the
// heartbeat a busy rank sends, and the tests' fault injection. Internal to engine/pipeline/.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/pipeline/boundary.h"
#include "engine/pipeline/options.h"
#include "ir/graph.h"
#include "models/step.h"
#include "runtime/net.h"

namespace xserv::engine::pipeline::wire {

enum FrameType : uint8_t {
  kHello = 1,      ///< worker -> rank 0: {rank, world, digest}
  kWelcome = 2,    ///< rank 0 -> worker: accepted
  kStep = 3,       ///< rank 0 -> worker: step inputs and received activations
  kResult = 4,     ///< worker -> rank 0: what the stage sends on
  kAlive = 5,      ///< worker -> rank 0 while computing
  kReset = 6,      ///< rank 0 -> worker: clear the KV caches
  kQuit = 7,       ///< rank 0 -> worker: exit
  kFail = 8,       ///< either way: {message}; the sender stops
  kReady = 9,      ///< worker -> rank 0: its stage is loaded
  kChallenge = 10, ///< rank 0 -> a new connection, first: {nonce}
};

/// Bounds on what a frame may announce before the peer has proven it holds the token: the
/// challenge, hello and welcome are small JSON headers.
inline constexpr uint64_t kMaxHandshakeBytes = 64 << 10;
/// Frames that carry no tensors and no step (kAlive, kReset, kQuit, kReady) after the handshake.
inline constexpr uint64_t kMaxControlBytes = 64 << 10;
/// A kFail frame: one message.
inline constexpr uint64_t kMaxFailBytes = 1 << 20;

/// The most bytes a frame's JSON header (with its 8-byte length) may take when it lists `ints`
/// integers (token ids, context lengths, block tables, ids) and describes `tensors`: 12 characters
/// an int32 and its comma take, and room for each tensor's entry.
uint64_t header_bound(uint64_t ints, const std::vector<BoundaryTensor>& tensors);

/// What a worker accepts from rank 0 after the handshake, by frame type, checked before
/// anything is allocated: a kStep frame up to the bytes of the largest step the run allows
/// (`max_batch` sequences of `max_seq` tokens: their header and the stage program's receives),
/// kFail up to kMaxFailBytes, anything else kMaxControlBytes.
runtime::FrameBound worker_frame_bound(const ir::Graph& stage, int64_t max_batch, int64_t max_seq);
/// The same for a stage of a compiled plan (its recorded receives).
runtime::FrameBound worker_frame_bound(const runtime::PlanStage& stage, int64_t max_batch,
                                       int64_t max_seq);

/// The most bytes rank 0 accepts in a rank's kResult for the (micro-batch) step `in`: its header
/// and `sends` (an intermediate rank's activations for this step; none over NCCL); from the last
/// rank (`last`) one id per sequence (`greedy`) or one f32 logits tensor of at most [tokens,
/// vocab].
uint64_t result_frame_bytes(const models::StepInput& in, const std::vector<BoundaryTensor>& sends,
                            bool last, bool greedy, int64_t vocab);
/// What rank 0 accepts while it waits for a frame of type `want`: `want_bytes` for it, kFail up
/// to kMaxFailBytes, anything else kMaxControlBytes.
runtime::FrameBound reply_frame_bound(uint8_t want, uint64_t want_bytes);

/// HMAC-SHA256 of `msg` under `key`, as 64 hex characters.
std::string hmac_sha256(const std::string& key, const std::string& msg);
/// `n` bytes from /dev/urandom.
std::string random_bytes(size_t n);
/// Equal strings, compared in time independent of where they differ.
bool same_digest(const std::string& a, const std::string& b);
/// The handshake's proofs: a worker's over rank 0's challenge and what it claims (rank, world,
/// plan digest, its own nonce); rank 0's over the worker's nonce. Neither reveals the token.
std::string hello_proof(const std::string& token, const std::string& challenge, int rank, int world,
                        const std::string& digest, const std::string& nonce);
std::string welcome_proof(const std::string& token, const std::string& nonce, int rank);
/// The pipeline's shared secret: `given` (PipelineOptions::token) when not empty; else, for a rank
/// 0 that spawns its workers on this host (`spawned_here`), a random one it passes to them; else
/// UsageError.
std::string pipeline_token(const std::string& given, bool spawned_here);

/// A frame's payload: the header as JSON (with a "tensors" list added) and the tensors' bytes.
std::string encode(const nlohmann::json& head, const Named& tensors);
/// The header of a payload, and its tensors into `tensors` when given; clear errors for a
/// truncated or inconsistent payload.
nlohmann::json decode(const std::string& payload, Named* tensors);
runtime::Frame message(uint8_t type, const nlohmann::json& head, const Named& tensors = {});

/// The step inputs of a kStep message's header (`greedy`: the last rank sends back only the
/// sequences' greedy ids), and back; step_from_header throws xserv::Error naming a missing or
/// mistyped field (the sizes are validate_step's to check).
nlohmann::json step_header(const models::StepInput& in, int64_t step, bool greedy);
models::StepInput step_from_header(const nlohmann::json& h);

/// Bytes as lowercase hex (the NCCL unique id inside a JSON frame), and back.
std::string to_hex(const std::string& bytes);
std::string from_hex(const std::string& hex);

/// How long one pipelined step's NCCL transfers may take on a rank (receiving includes the
/// previous stage's compute): three rank timeouts.
inline std::chrono::milliseconds nccl_step_timeout(std::chrono::milliseconds rank_timeout) {
  return 3 * rank_timeout;
}

/// Sends kAlive on `c` every second until destroyed (a rank computing or loading); the
/// destructor returns at once, not at the next beat.
class Heartbeat {
public:
  Heartbeat(runtime::Connection& c, std::mutex& send_lock);
  ~Heartbeat();

private:
  std::mutex mu_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread thread_; ///< last: starts after the members it uses
};

/// Fault injection for the tests (PipelineOptions::fault): "RANK:exit@STEP", "RANK:hang@STEP"
/// or "RANK:stop@STEP" (SIGSTOP: the whole process frozen).
void maybe_fault(const std::optional<Fault>& f, int rank, int64_t step);
/// XSERV_PIPELINE_FAULT="RANK:stall@STEP": called while the rank sends heartbeats, it never
/// returns (alive, no progress).
void maybe_stall(const std::optional<Fault>& f, int rank, int64_t step);
/// XSERV_PIPELINE_FAULT="RANK:narrow@STEP": the result of that step goes back malformed (ids
/// outside the vocabulary, logits cut to 10 columns).
void maybe_corrupt(const std::optional<Fault>& f, int rank, int64_t step, Named& out,
                   nlohmann::json& reply);

} // namespace xserv::engine::pipeline::wire
