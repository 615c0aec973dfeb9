// The Engine: continuous batching of generation requests over one Model. Requests join and
// leave between steps; each step runs one decode token of every running sequence and fills the
// rest of a token budget with prompt chunks of the others (the shape of MLC-LLM's serve engine
// and of vLLM's scheduler with chunked prefill). The Scheduler (engine/scheduler.h) picks a
// step's work; the Engine takes requests in from other threads, runs the model and turns its
// output into tokens and finishes.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "engine/model.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "runtime/sampler.h"

namespace xserv::engine {

class WorkerPool;

/// Counters and gauges of an Engine, a consistent snapshot.
struct EngineStats {
  int64_t running = 0;        ///< sequences holding KV blocks (in prefill or decode)
  int64_t waiting = 0;        ///< queued, or preempted and waiting to be recomputed
  int64_t kv_rows_in_use = 0; ///< == running
  int64_t kv_rows = 0;        ///< sequences the engine may run at once (max_running)
  // The KV pools (engine/kv/kv_cache.h): blocks of kv_block_size positions.
  int64_t kv_block_size = 0;
  int64_t kv_blocks = 0, kv_blocks_used = 0;
  int64_t kv_window_blocks = 0, kv_window_blocks_used = 0;
  int64_t kv_cached_free = 0; ///< free full blocks still holding a cached prefix block
  int64_t prefix_queries = 0; ///< prompt tokens looked up in the prefix cache
  int64_t prefix_hits = 0;    ///< of them, tokens found cached (not computed again)
  int64_t prefix_evictions = 0;
  int64_t preemptions = 0; ///< sequences preempted (blocks freed, recomputed later)
  int64_t steps = 0;
  int64_t prompt_tokens = 0;    ///< prompt tokens processed
  int64_t generated_tokens = 0; ///< tokens generated
  int64_t finished_stop = 0, finished_length = 0, finished_abort = 0, finished_error = 0;
  double model_ms = 0;    ///< host wall time inside the model's step calls
  double schedule_ms = 0; ///< host wall time of step() outside the model (scheduling, sampling)
};

/// add() with the queue at max_queue.
class QueueFull : public Error {
public:
  using Error::Error;
};

/// Continuous batching over one Model. add(), abort(), stats() and wait_for_work() may be called
/// from any thread; step() from one thread at a time.
class Engine {
public:
  /// The model must outlive the engine. Starts with every KV block free (resets the model).
  /// Throws xserv::Error when the model's KV pools cannot hold one sequence of max_seq.
  explicit Engine(Model& model, EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Queues a request; it joins at the next step that has room, budget and KV blocks. Throws
  /// xserv::Error naming the field or limit for a request the model cannot run (empty prompt,
  /// prompt longer than max_seq, an id outside the vocabulary, max_tokens < 1 (0 only with
  /// prompt_logprobs and a prompt of 2+ tokens), top_logprobs or prompt_logprobs above 20, n
  /// outside [1, min(kMaxChoices, max_running)], sampling options out of range) and QueueFull when
  /// max_queue are waiting.
  RequestId add(Request request);
  /// The request leaves at the next step: each of its unfinished choices' last event has finish
  /// Abort and its blocks are free for that step's newcomers. Unknown or finished ids are
  /// ignored. With `choice` >= 0, only that choice leaves (a stop string matched in one of n);
  /// before the request forks into its choices (its first token) that is all of them.
  void abort(RequestId id, int choice = -1);
  /// Runs one step: takes in new requests and aborts, picks the step's sequences, runs the model
  /// and samples. Returns this step's events in order (a request's events in token order).
  /// When the model throws, the error goes up and nothing is lost: the step's sequences keep
  /// their state (the next step runs the same tokens again) and its abort events come with the
  /// next step.
  std::vector<Event> step();
  /// Nothing running, waiting or pending.
  bool idle() const;
  /// Blocks until a request or an abort is pending or `timeout` passes; returns !idle().
  bool wait_for_work(std::chrono::milliseconds timeout);
  EngineStats stats() const;
  /// Prompt tokens the last step() processed (0: a decode-only step). For step()'s thread.
  int64_t last_step_prompt_tokens() const { return last_prompt_tokens_; }
  Model& model() { return model_; }
  const EngineOptions& options() const { return options_; }

private:
  /// Step 1: requests and aborts other threads queued; aborted sequences' last events.
  void take_in(std::vector<Event>& events, int64_t& aborted_waiting, int64_t& aborted_running);
  /// Step 3: the scheduled sequences' tokens and finishes from the model's output (`yields`:
  /// which of them reached their last token); a request with n > 1 forks into its choices at
  /// its first token; finished sequences leave the scheduler. Counts into `generated` and
  /// `finished` (stop, length, error).
  /// `need`: per sequence, whether its logits row came back; `masked`: whether its greedy pick
  /// came from Model::step_masked; `masks`: the token mask its constraint gave for this token
  /// (empty: none was computed).
  void update_from_output(const ScheduledStep& s, const std::vector<bool>& yields,
                          const std::vector<bool>& need, const std::vector<bool>& masked,
                          const StepOutput& out, const std::vector<std::vector<uint32_t>>& masks,
                          int64_t step_index, std::vector<Event>& events, int64_t& generated,
                          int64_t finished[3]);
  /// A step_all step's output: each sequence's greedy pick and (where `need`) its row from its
  /// last token's row, every row kept for the scores.
  static StepOutput all_rows_output(std::vector<std::vector<float>> rows,
                                    const models::StepInput& in, const std::vector<bool>& need);
  /// Records a scored prompt position's log-probability from its row (Sequence::scores_at);
  /// false when that ends the request, each of its choices with an event: a row not finite (an
  /// error), or the last score of a max_tokens 0 request (length, the scores with it).
  bool score_prompt(Sequence& q, const std::vector<float>& row, int64_t step_index,
                    std::vector<Event>& events, int64_t finished[3]);
  /// The next token of `q` from its step's row (`greedy`: the model's pick, over its mask when
  /// `masked`; `mask`: its constraint's, computed during the step, or empty), its event and its
  /// finish; true when it finished.
  bool take_token(Sequence& q, int32_t greedy, const std::vector<float>& row, bool need,
                  bool masked, const std::vector<uint32_t>& mask, int64_t step_index,
                  std::vector<Event>& events, int64_t& generated, int64_t finished[3]);
  /// The stats the scheduler knows (running, waiting, the KV pools), under mu_.
  void refresh_stats();

  Model& model_;
  EngineOptions options_;
  std::unique_ptr<WorkerPool> mask_pool_; ///< the token masks' threads (step()'s), once needed
  mutable std::mutex mu_; ///< guards pending_, aborts_, next_id_, stats_ and the counts
  std::condition_variable work_;
  RequestId next_id_ = 1;
  struct Pending {
    RequestId id;
    Request req;
    std::chrono::steady_clock::time_point added;
  };
  std::deque<Pending> pending_;                       ///< added, not yet seen by step()
  std::vector<std::pair<RequestId, int>> aborts_;     ///< (id, choice or -1 for all)
  EngineStats stats_;
  // Owned by step():
  Scheduler scheduler_;
  int64_t last_prompt_tokens_ = 0;
  std::vector<Event> undelivered_; ///< events of a step whose model call threw
};

/// A finished request, as generate() returns it.
struct Generation {
  std::vector<int32_t> tokens; ///< generated ids (a stop id included when one ended it)
  FinishReason finish = FinishReason::None;
  bool hit_max_seq = false;
  std::string error; ///< finish Error: Event::error
};

/// Called with each event of request `index` (its position in generate()'s list); returning
/// false aborts that request.
using EventCallback = std::function<bool(size_t index, const Event&)>;

/// Time and token totals of a generate() call.
struct GenerateStats {
  double prompt_ms = 0; ///< wall time of steps that processed prompt tokens
  double decode_ms = 0; ///< wall time of the other steps
  int64_t prompt_tokens = 0, generated_tokens = 0;
};

/// Runs every request through an Engine over `model` to its end (`while (!idle()) step()`),
/// all queued at once (so up to max_running at a time, the rest joining as blocks free up).
/// Requests of one choice only (n = 1).
/// Throws xserv::Error naming the request for one the model cannot run, before any step. A
/// request that finishes with FinishReason::Error does not stop the others; its Generation
/// says so (throw_if_failed turns the first into an xserv::Error).
std::vector<Generation> generate(Model& model, const std::vector<Request>& requests,
                                 const EventCallback& on_event = {}, EngineOptions options = {},
                                 GenerateStats* stats = nullptr);

/// Throws xserv::Error with the error of the first generation that finished with
/// FinishReason::Error (naming its index when there are several); returns otherwise.
void throw_if_failed(const std::vector<Generation>& gens);

} // namespace xserv::engine
