// Engines run forward steps of a model; generate() drives one over batched requests.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/config.h"
#include "models/step.h"
#include "runtime/sampler.h"

namespace xserv::cli {

/// Times work on an engine's own timeline (CUDA events on its stream for the GPU; the host clock
/// after synchronize() otherwise), for benchmarks.
class Stopwatch {
public:
  virtual ~Stopwatch() = default;
  /// Marks the start, after the work queued so far.
  virtual void start() = 0;
  /// Milliseconds from start() to the end of the work queued since; waits for that work.
  virtual double stop() = 0;
};

/// Runs forward steps of one model over up to max_batch sequences of up to max_seq tokens.
class Engine {
public:
  virtual ~Engine() = default;
  virtual const models::ModelConfig& config() const = 0;
  virtual int64_t max_batch() const = 0;
  virtual int64_t max_seq() const = 0;
  virtual std::string backend() const = 0;
  /// One step: returns the logits of each sequence's last new token, one row per sequence.
  virtual std::vector<std::vector<float>> step(const models::StepInput& in) = 0;
  /// One step that returns each sequence's greedy token: runtime::argmax of the row step()
  /// would return (ties to the lower id). Backends may pick on the device and skip the logits.
  virtual std::vector<int32_t> step_greedy(const models::StepInput& in);
  /// Forgets every cached sequence.
  virtual void reset() = 0;
  /// Waits until queued work is done, so host timers bracket it (a no-op on the CPU).
  virtual void synchronize() {}
  /// Peak device memory in GiB since the engine started, or -1 when the backend cannot tell.
  virtual double peak_memory_gib() const { return -1; }
  /// A stopwatch on this engine's timeline; the default uses the host clock around
  /// synchronize().
  virtual std::unique_ptr<Stopwatch> stopwatch();
};

struct GenRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 128;
  runtime::SamplerOptions sampling;
  std::vector<int32_t> stop_ids; ///< generation ends after emitting one of these
};

struct GenResult {
  std::vector<int32_t> tokens; ///< generated ids (a stop id included when one ended it)
  bool stopped = false;        ///< ended on a stop id (else max_tokens or max_seq)
};

struct GenStats {
  double prefill_ms = 0, decode_ms = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;
};

/// Called for each token as it is produced: (request index, token). Returning false ends
/// that request early.
using TokenCallback = std::function<bool(size_t, int32_t)>;

/// Called with each step's logits row of a request before its token is picked: (request index,
/// logits). Setting one brings every step's logits to the host (greedy picks included).
using LogitsCallback = std::function<void(size_t, const std::vector<float>&)>;

/// Throws xserv::Error when a prompt of `ids` exceeds `max_seq` tokens or holds an id outside
/// [0, vocab): what generate() and `xserv trace` check before the first step.
void check_prompt(const std::vector<int32_t>& ids, int64_t max_seq, int64_t vocab);

/// Generates for every request, batched up to the engine's max_batch at a time: one prefill
/// step over the prompts, then one decode step per token over the sequences still running.
/// Throws xserv::Error naming the limit when a prompt does not fit max_seq.
std::vector<GenResult> generate(Engine& engine, const std::vector<GenRequest>& requests,
                                const TokenCallback& on_token = {}, GenStats* stats = nullptr,
                                const LogitsCallback& on_logits = {});

} // namespace xserv::cli
