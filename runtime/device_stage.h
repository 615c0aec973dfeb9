// One stage program on the GPU: its arena, KV caches, step-input block and scratch buffers
// allocated, its kernels loaded, its launch table bound to them and replayed one sub-step at a
// time, decode sub-steps as captured CUDA graphs. The CUDA model (engine/cuda_model.h) drives it;
// nothing here knows a checkpoint or a step's tokens, only the layout and the table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/plan.h"
#include "runtime/plan_stage.h"

struct CUstream_st; // cudaStream_t is CUstream_st*

namespace xserv::runtime {

/// A CUDA stream (cudaStream_t) without including the CUDA headers here.
using Stream = ::CUstream_st*;

/// How a pipeline stage's boundary activations move on the device, sub-step by sub-step (NCCL
/// between ranks, device copies on one GPU): receive() is called for each recv value before a
/// sub-step runs (fill `bytes` at `dst` on `stream`), send() with the send value after it, and
/// wait() instead of synchronising the stream (a bounded wait that notices a dead peer).
struct StageTransport {
  std::function<void(const std::string& name, void* dst, size_t bytes, Stream stream)> receive;
  std::function<void(const void* src, size_t bytes, Stream stream)> send;
  std::function<void(Stream stream)> wait;
};

/// How a DeviceStage runs.
struct DeviceStageOptions {
  bool quiet = false;           ///< no "[cuda] ..." progress lines on stderr
  bool cuda_graphs = true;      ///< decode sub-steps (tokens == seqs) as captured CUDA graphs
  bool capture_at_start = true; ///< capture every decode shape in load(), not in a request
  bool dependent_launch = true; ///< programmatic dependent launch (sm_90 and newer only)
  /// Every table entry timed with CUDA events (graphs off), summed per (phase, op) and printed
  /// when the stage closes.
  bool profile = false;
  /// Executor::set_repeat's measurement aid: launches of kernels whose name contains
  /// `repeat_kernel` go out `repeat_times` times (XSERV_PROFILE_REPEAT=NAME[:TIMES]).
  std::string repeat_kernel;
  int repeat_times = 2;
};

/// A host buffer copied into the arena before a sub-step runs (a received activation's rows).
struct HostUpload {
  uint64_t arena_offset = 0;
  const void* src = nullptr;
  size_t bytes = 0;
};

/// One sub-step for DeviceStage::run.
struct SubStep {
  StepShape shape;
  /// The parts of the step-input block to upload, as (first int32, count); empty: all of it.
  std::vector<std::pair<size_t, size_t>> params;
  std::vector<HostUpload> uploads;           ///< after the step inputs, in order
  const StageTransport* transport = nullptr; ///< receives before, sends after, waits
  size_t rows = 0; ///< output rows of the sub-step: its tokens (per-token output) or sequences
  /// false: all `rows` output rows come back to output_host(). true: the sampling epilogue's
  /// keys of the `rows` rows come back to keys_host(), and only the output rows in `wanted`
  /// (each at its own row of output_host()).
  bool keys = false;
  std::vector<size_t> wanted;
  /// Structured output's masked greedy picks (with `keys`, on a stage with picks_masked()):
  /// once the sub-step's launches are queued, run() calls masks(staging, rows); the callee
  /// writes each masked row's mask into staging (mask_words() uint32 a row, one after another)
  /// and its output row (below `rows`) into rows, and returns how many (at most `rows`). Those
  /// rows' keys then come from the masked pick. The host fills masks while the device runs.
  std::function<size_t(uint32_t* staging, int32_t* rows)> masks;
};

/// A stage's device memory, kernels and launch table (see the file comment).
class DeviceStage {
public:
  /// Creates its stream and allocates what `layout` asks for but the KV caches: the arena, pinned
  /// host buffers for the output rows, and the step-input block of `param_words` int32 values
  /// (input `name` at param_offsets[name]). Throws xserv::Error on CUDA errors.
  DeviceStage(const StageLayout& layout, const std::map<std::string, size_t>& param_offsets,
              size_t param_words, const DeviceStageOptions& options);
  ~DeviceStage();
  DeviceStage(const DeviceStage&) = delete;
  DeviceStage& operator=(const DeviceStage&) = delete;

  /// Allocates the KV caches (cleared): every cache of the full-attention pool holds
  /// `kv_blocks` blocks, every cache of the sliding-window pool (the layout's caches with
  /// `window` set) `window_blocks`; a block id pages all of a pool's layers. Before load();
  /// throws xserv::Error naming the bytes when they do not fit.
  void allocate_pools(int64_t kv_blocks, int64_t window_blocks);
  /// Device bytes one block of each pool takes over all of the stage's caches (known from the
  /// layout, before allocate_pools).
  uint64_t kv_block_bytes() const { return kv_block_bytes_; }
  uint64_t window_block_bytes() const { return window_block_bytes_; }

  /// Binds `table` to the stage's memory and `weights` (device pointers by name, kept alive by
  /// the caller), uploads its scratch constants, loads `cubins` (one per table.kernels entry)
  /// and, with cuda_graphs and capture_at_start, captures every decode shape (batch
  /// 1..max_batch x attention key buckets up to max_seq). `source` and `compiled` name the
  /// program in the log.
  void load(LaunchTable table, const std::vector<std::vector<char>>& cubins,
            const std::map<std::string, void*>& weights, const std::string& source, int compiled,
            double load_ms);

  /// The pinned host block of step inputs, uploaded at the start of each run().
  int32_t* params() { return params_host_; }
  /// Runs one sub-step (the step inputs already in params()) and copies back what `s` asks for;
  /// returns once that is on the host (a stage that sends: once its transport's wait returned).
  void run(const SubStep& s);
  /// The output rows run() copied back ([rows, output.vocab] fp32).
  const float* output_host() const { return out_host_; }
  /// The greedy keys run() copied back (argmax_chunks() per row; runtime::argmax_of_keys).
  const uint64_t* keys_host() const { return keys_host_; }
  int argmax_chunks() const { return argmax_chunks_; }
  /// Whether the table ends with the sampling epilogue (greedy keys per sequence).
  bool picks_greedy() const { return argmax_keys_ != nullptr; }
  /// Whether it also has structured output's masked pick (SubStep::masks).
  bool picks_masked() const { return mask_host_ != nullptr; }
  /// uint32 words of one row's mask (picks_masked()).
  int mask_words() const { return mask_words_; }

  /// Clears the KV caches.
  void reset();
  /// Queues a copy of block `src` to block `dst` in every cache of one pool (the sliding-window
  /// pool's with `window`), ahead of the next run() on the stage's stream.
  void copy_block(bool window, int32_t src, int32_t dst);
  /// Blocks of the full-attention and the sliding-window pools (after allocate_pools).
  int64_t kv_blocks() const { return kv_blocks_; }
  int64_t window_blocks() const { return window_blocks_; }
  void synchronize();
  /// `count` floats of the arena from byte `offset`, after the queued work. Throws xserv::Error
  /// for a range outside the arena.
  std::vector<float> read_arena(uint64_t offset, size_t count) const;
  size_t graphs_captured() const;
  size_t entries() const; ///< launch table entries (after load)
  size_t allocated_bytes() const { return allocated_; }
  Stream stream() const { return stream_; }

private:
  struct State;
  void log(const std::string& line) const;
  void* allocate(size_t bytes, const void* host = nullptr);
  void capture_all();
  void print_profile() const;
  /// A timeline plan's report (runtime/timeline.h) on stderr.
  void print_timeline() const;

  StageLayout layout_;
  DeviceStageOptions options_;
  std::map<std::string, size_t> param_offsets_;
  size_t param_words_ = 0;
  std::vector<void*> allocations_;
  size_t allocated_ = 0;
  Stream stream_ = nullptr;
  char* arena_ = nullptr;
  int32_t* params_dev_ = nullptr;
  int32_t* params_host_ = nullptr; ///< pinned
  float* out_host_ = nullptr;      ///< pinned, [rows, V] of the output
  void* argmax_keys_ = nullptr;    ///< device greedy keys of the sampling epilogue (or nullptr)
  int argmax_chunks_ = 0;          ///< keys per sequence
  uint64_t* keys_host_ = nullptr;  ///< pinned, [max_batch, argmax_chunks]
  void* masks_dev_ = nullptr;      ///< the masked pick's masks and rows (scratch), or nullptr
  void* mask_rows_dev_ = nullptr;
  uint32_t* mask_host_ = nullptr;  ///< pinned staging, [max_batch, mask_words]
  int32_t* mask_rows_host_ = nullptr; ///< pinned, [max_batch]
  int mask_words_ = 0;
  std::vector<std::pair<void*, size_t>> caches_; ///< in the layout's order
  int64_t kv_blocks_ = 0, window_blocks_ = 0;
  uint64_t kv_block_bytes_ = 0, window_block_bytes_ = 0;
  std::unique_ptr<State> state_; ///< kernels, executor, decode graphs, profiling events
};

/// Two CUDA events on a stream: the time the GPU's queue took between start() and stop().
class EventTimer {
public:
  explicit EventTimer(Stream stream);
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start();
  /// Milliseconds since start(), waiting for the work queued since.
  double stop();

private:
  Stream stream_;
  void* begin_ = nullptr; ///< cudaEvent_t
  void* end_ = nullptr;
};

} // namespace xserv::runtime
