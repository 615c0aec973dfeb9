// A model: forward steps of one gpt-oss network over paged KV caches (CPU interpreter, CUDA plan,
// pipelined stages). The Engine (engine/engine.h) schedules requests onto one.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/config.h"
#include "models/step.h"

namespace xserv::engine {

/// Times work on a model's own timeline (CUDA events on its stream for the GPU; the host clock
/// after synchronize() otherwise), for benchmarks.
class Stopwatch {
public:
  virtual ~Stopwatch() = default;
  /// Marks the start, after the work queued so far.
  virtual void start() = 0;
  /// Milliseconds from start() to the end of the work queued since; waits for that work.
  virtual double stop() = 0;
};

/// A greedy pick from a logits row that held a NaN or an infinity: no token (the Engine ends
/// that request with FinishReason::Error). Host picks report it; the CUDA model's device pick
/// skips NaN and cannot tell.
inline constexpr int32_t kNonFinite = -1;

/// A masked greedy pick (Model::step_masked) whose mask allowed no id.
inline constexpr int32_t kNoneAllowed = -2;

/// Structured output's masks for Model::step_masked: one per sequence of the step (mask_words
/// of the vocabulary uint32, bit t % 32 of word t / 32 allowing id t; empty where the sequence
/// is not masked). Called after the step's forward pass is queued, so the host fills the masks
/// while the device runs; may be called again and returns the same masks.
using MaskSource = std::function<const std::vector<std::vector<uint32_t>>&()>;

/// runtime::argmax of `row`, or kNonFinite when the row holds a NaN or an infinity.
int32_t greedy_pick(const std::vector<float>& row);

/// What one step brings back: per sequence of the step, its greedy token (always; kNonFinite
/// for a row that was not finite) and its logits row where the caller asked for it (empty rows
/// elsewhere).
struct StepOutput {
  std::vector<int32_t> greedy;
  std::vector<std::vector<float>> logits;
  /// A Model::step_all step's: every token's row, sequence b's from row_begin[b] (empty else).
  std::vector<std::vector<float>> rows;
  std::vector<size_t> row_begin;
};

/// Runs forward steps of one model for up to max_batch sequences a step of up to max_seq tokens
/// each, over paged KV caches (kv_geometry(): the block size and the pools' blocks). A step
/// (models::StepInput) mixes sequences freely: each brings one or more new tokens, its context
/// length and its block tables. Only a sequence's cached positions below its context length are
/// read, so a block needs no clearing before another sequence takes it.
class Model {
public:
  virtual ~Model() = default;
  virtual const models::ModelConfig& config() const = 0;
  /// The most sequences a step may hold.
  virtual int64_t max_batch() const = 0;
  /// The longest sequence, in positions.
  virtual int64_t max_seq() const = 0;
  /// How the KV caches are paged: block size, table width, window, blocks of each pool.
  virtual const models::KvGeometry& kv_geometry() const = 0;
  virtual std::string backend() const = 0;
  /// One step: returns the logits of each sequence's last new token, one row per sequence.
  virtual std::vector<std::vector<float>> step(const models::StepInput& in) = 0;
  /// One step that returns each sequence's greedy token: greedy_pick of the row step() would
  /// return (ties to the lower id; kNonFinite for a row with a NaN or an infinity). Backends may
  /// pick on the device and skip the logits.
  virtual std::vector<int32_t> step_greedy(const models::StepInput& in);
  /// One step that returns every sequence's greedy token and the logits rows of the sequences
  /// with need_logits[b] set (need_logits has one entry per sequence). The default runs
  /// step_greedy when no row is wanted, else step() and picks on the host.
  virtual StepOutput step_mixed(const models::StepInput& in, const std::vector<bool>& need_logits);
  /// step_mixed whose greedy picks of the sequences with masked[b] set are made over the ids
  /// their masks (from `masks`) allow: the best allowed id (ties to the lower), kNoneAllowed
  /// when the mask allows none, kNonFinite for a row with a NaN or an infinity anywhere. A
  /// masked sequence's logits row comes back only with need_logits[b]. The default picks on the
  /// host from the step's rows; a backend with picks_masked() picks on the device.
  virtual StepOutput step_masked(const models::StepInput& in, const std::vector<bool>& need_logits,
                                 const std::vector<bool>& masked, const MaskSource& masks);
  /// Whether step_masked picks on the device, so a masked sequence's logits need not come back.
  virtual bool picks_masked() const { return false; }
  /// Whether step_all is there: the graph returns every token's logits row (a plan compiled
  /// with --all-logits), so that a prompt can be scored in chunks.
  virtual bool all_rows() const { return false; }
  /// One step returning every token's logits row: the step's tokens in order, sequence by
  /// sequence. Throws unless all_rows().
  virtual std::vector<std::vector<float>> step_all(const models::StepInput& in);
  /// Forgets every cached sequence (clears the pools).
  virtual void reset() = 0;
  /// Waits until queued work is done, so host timers bracket it (a no-op on the CPU).
  virtual void synchronize() {}
  /// Peak device memory in GiB since the model was loaded, or -1 when the backend cannot tell.
  virtual double peak_memory_gib() const { return -1; }
  /// A stopwatch on this model's timeline; the default uses the host clock around
  /// synchronize().
  virtual std::unique_ptr<Stopwatch> stopwatch();
  /// Why the model can run no further steps (a pipeline rank died or hung), or "" while it can.
  /// A server reports itself unhealthy while this is set; step() throws from then on.
  virtual std::string broken() const { return ""; }
};

/// Throws xserv::Error when a prompt of `ids` is empty, exceeds `max_seq` tokens or holds an id
/// outside [0, vocab), naming both numbers.
void check_prompt(const std::vector<int32_t>& ids, int64_t max_seq, int64_t vocab);

} // namespace xserv::engine
