// Lowering a fused gpt-oss graph to a sequence of CUDA kernel launches for the CUDA engine.
#pragma once

#include <cuda_runtime_api.h>

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "codegen/emit.h"
#include "ir/graph.h"
#include "runtime/module.h"

namespace xserv::cli {

/// The run-time sizes of one (sub-)step that launches depend on.
struct DeviceStep {
  int tokens = 0;  ///< T: tokens in the step, at most the engine's token capacity
  int seqs = 0;    ///< B: sequences in the step
  int max_pos = 0; ///< the largest position of any token (decides attention key splits)
  cudaStream_t stream = nullptr;
};

/// The key count attention's split count is chosen for when a token sees at most `keys` keys:
/// `keys` rounded up to a power of two, at least 64 and at most 2048 (where the split count
/// saturates). Launches depend on the step only through (tokens, seqs, this bucket of
/// max_pos + 1), so a CUDA graph captured for one step replays correctly for any step with the
/// same three; attention_decode leaves the surplus splits of a smaller context empty.
int attention_key_bucket(int keys);

/// Tokens one step (the activation arena) holds: the prefill chunk, at least max_batch and 8.
int step_token_capacity(int64_t max_batch, int prefill_chunk);

/// Where compiled kernels are cached: $XSERV_KERNEL_CACHE, else $XDG_CACHE_HOME/xserv/kernels,
/// else ~/.cache/xserv/kernels.
std::filesystem::path kernel_cache_dir();

/// The generated kernels of an engine, each once by name, compiled together.
class KernelSet {
public:
  /// Adds `src` unless a kernel of that name is already there; returns its index.
  int add(codegen::KernelSource src);
  /// Compiles (or loads from `cache_dir`) and loads every kernel; returns how many NVRTC
  /// actually compiled (the rest came from the cache).
  int build(const std::filesystem::path& cache_dir);
  size_t size() const { return sources_.size(); }
  /// How many lowered nodes asked for kernel `i`.
  int uses(int i) const { return uses_.at(static_cast<size_t>(i)); }
  const codegen::KernelSource& source(int i) const { return sources_.at(static_cast<size_t>(i)); }

  /// Launches kernel `i` for `rows` grid rows (tokens, or sequences for per-sequence kernels)
  /// and `splits` key splits, by its launch rule; argument types must match exactly.
  template <typename... Args>
  void launch(int i, int rows, int splits, cudaStream_t stream, const Args&... args) const {
    void* slots[] = {const_cast<void*>(static_cast<const void*>(&args))...};
    const size_t sizes[] = {sizeof(Args)...};
    launch_raw(i, rows, splits, stream, slots, sizes, sizeof...(Args));
  }

  /// launch() with type-erased arguments (`args[i]` points at `sizes[i]` bytes).
  void launch_raw(int i, int rows, int splits, cudaStream_t stream, void** args,
                  const size_t* sizes, size_t count) const {
    if (counts_) {
      ++(*counts_)[static_cast<size_t>(i)];
      return;
    }
    const codegen::KernelSource& s = source(i);
    const auto g = s.launch.grid(rows, splits);
    modules_.at(static_cast<size_t>(i))
        .launch_raw(kernels_.at(static_cast<size_t>(i)), dim3(g[0], g[1], g[2]),
                    dim3(s.launch.block), s.launch.smem(rows), stream, args, sizes, count,
                    dependent_);
  }

  /// Launches allow programmatic dependent launch (runtime::Module::launch_raw): each kernel's
  /// blocks are scheduled while its predecessor drains, hiding the launch gap between kernels.
  void set_dependent_launch(bool on) { dependent_ = on; }

  /// Counting mode (no GPU needed): while `counts` is set, launches only add one to
  /// (*counts)[kernel]; nullptr launches again.
  void count_launches(std::vector<int>* counts) {
    counts_ = counts;
    if (counts_)
      counts_->assign(sources_.size(), 0);
  }

private:
  std::vector<int>* counts_ = nullptr;
  bool dependent_ = false;
  std::vector<codegen::KernelSource> sources_;
  std::map<std::string, int> by_name_;
  std::vector<int> uses_;
  std::vector<runtime::Module> modules_;
  std::vector<runtime::Kernel> kernels_;
};

/// What the lowering needs from the engine: device addresses and allocations.
struct LoweringContext {
  int max_tokens = 8;                  ///< T capacity of the activation arena and scratch buffers
  int max_seqs = 1;                    ///< B capacity
  int64_t cache_rows = 1, max_seq = 1; ///< the N and S dims of cache nodes
  /// Gemm activations as a bf16 hi + lo pair (about fp32 precision, twice the MMAs) rather than
  /// one bf16 value.
  bool gemm_split = true;
  /// Device address of result `result` of value `v` (params, weights, caches, activations).
  std::function<void*(ir::ValueId v, int result)> address;
  /// A device buffer of `bytes` that lives as long as the engine, filled from `host` if given.
  std::function<void*(size_t bytes, const void* host)> allocate;
  /// Set by lower_graph when the graph's first output is per-sequence logits [B, V] fp32: the
  /// sampling epilogue's greedy keys, argmax_chunks(V) uint64 per sequence, written every step
  /// (decode them with codegen::argmax_of_keys). nullptr otherwise.
  void* argmax_keys = nullptr;
  int argmax_chunks = 0;
};

/// One launch (or a few) of a lowered node, run in node order every step.
using LaunchFn = std::function<void(const DeviceStep&)>;

/// Lowers every node of `g` (the default pipeline's output) to launches of kernels it adds to
/// `kernels`; reshape and extract are aliases and sources launch nothing. Each launch closure
/// reads pointers fixed at lowering time and only the step's sizes. Throws xserv::Error naming
/// the node for an op the CUDA engine does not lower yet. When the first output is per-sequence
/// logits, a last launch picks each row's greedy token (ctx.argmax_keys). `labels`, when given,
/// gets the op name of each launch function's node (for profiles).
std::vector<LaunchFn> lower_graph(const ir::Graph& g, KernelSet& kernels, LoweringContext& ctx,
                                  std::vector<std::string>* labels = nullptr);

} // namespace xserv::cli
