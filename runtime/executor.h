// Replaying a plan's launch table (runtime/plan.h) on the GPU, or recording it without one.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/module.h"
#include "runtime/plan.h"

namespace xserv::runtime {

/// One kernel launch as the recording mode reports it instead of launching: which kernel (an
/// index into the launch table's kernels), its geometry and its argument bytes in order.
struct LaunchRecord {
  int kernel = -1;  ///< -1 for a library call
  int library = -1; ///< the table's library call, or -1
  std::array<unsigned, 3> grid{};
  unsigned block = 0;
  size_t smem = 0;
  std::vector<std::string> args; ///< each argument's bytes, as the kernel receives them
};

/// Where the regions a launch table names live in device memory (or, for recording, anywhere:
/// the addresses are only copied into argument bytes).
struct Bindings {
  const void* arena = nullptr;                ///< Activation args
  std::map<std::string, const void*> weights; ///< Weight args, by tensor name
  std::vector<const void*> caches;            ///< Cache args, by index
  std::map<std::string, const void*> params;  ///< Param args, by step input name
  std::vector<const void*> scratch;           ///< Scratch args, one per table.scratch
};

/// Bindings that give every region `table` names a distinct non-null placeholder address (for
/// recording and counting without a GPU; nothing is dereferenced).
Bindings placeholder_bindings(const LaunchTable& table);

class Blas;

/// A loaded kernel the executor launches: the Module holding it and the kernel. Both must
/// outlive the executor.
struct LoadedKernel {
  const Module* module = nullptr;
  const Kernel* kernel = nullptr;
};

/// The LoadedKernels of `modules[i]` / `kernels[i]` (equal lengths; both must outlive the
/// executor and not be modified).
std::vector<LoadedKernel> loaded_kernels(const std::vector<Module>& modules,
                                         const std::vector<Kernel>& kernels);

/// Replays a LaunchTable: every argument is resolved to its bytes when the executor is built,
/// so a step only picks the active entries, fills argument buffers on the stack and launches.
/// A step allocates nothing and never synchronises, so it can run inside CUDA stream capture.
class Executor {
public:
  /// Binds `table` to device memory and kernels (`kernels[i]` for table.kernels[i]; empty: the
  /// executor can only record). Throws xserv::Error naming the first thing the table refers
  /// to that is not there: a kernel index, a weight, a cache, a step input or a scratch buffer,
  /// or a loaded kernel whose name differs from the table's.
  Executor(LaunchTable table, const Bindings& bindings, std::vector<LoadedKernel> kernels = {});

  /// Launches entries [begin, end) of the table (all by default) for a step of `shape` on
  /// `stream`; returns how many kernel launches that made.
  size_t run(const StepShape& shape, cudaStream_t stream, size_t begin = 0,
             size_t end = SIZE_MAX) const;

  /// Recording mode (no GPU): the launches run() would make, in order, instead of making them.
  std::vector<LaunchRecord> record(const StepShape& shape, size_t begin = 0,
                                   size_t end = SIZE_MAX) const;
  /// Launches the table's masked pick (LaunchTable::masked_pick) for `rows` masked rows, their
  /// masks and logits rows already in its scratch buffers; returns the launches made. Never
  /// part of a step (nor of its CUDA graph).
  size_t run_masked(int rows, cudaStream_t stream) const;
  /// Recording mode of run_masked.
  std::vector<LaunchRecord> record_masked(int rows) const;
  /// Whether the table has the masked pick.
  bool picks_masked() const { return !table_.masked_pick.empty(); }

  /// Launches allow programmatic dependent launch (Module::launch_raw's `dependent`).
  void set_dependent_launch(bool on) { dependent_ = on; }
  /// A measurement aid (XSERV_PROFILE_REPEAT): every launch of a kernel whose name contains
  /// `kernel` goes out `times` times in a row, so that a CUDA graph's step time grows by that
  /// kernel's cost where it sits (a kernel that updates its output in place then computes a
  /// different result: for timing only). Empty `kernel`: off.
  void set_repeat(std::string kernel, int times) {
    repeat_ = std::move(kernel);
    repeat_times_ = std::max(1, times);
  }
  /// The library the table's library calls go to (runtime/blas.h; must outlive the executor).
  /// A step of a table with library calls and none bound throws before it launches anything.
  void set_blas(const Blas* blas) { blas_ = blas; }

  const LaunchTable& table() const { return table_; }
  /// The (x, w, y) bases the table's first launch of library call `lib` binds (nulls when no
  /// launch calls it): its operands at the largest step, for Blas::tune_fixed at load.
  std::array<void*, 3> library_operands(int lib) const;
  /// Entries of the table (each launching zero or more kernels per step).
  size_t size() const { return table_.launches.size(); }

private:
  /// An argument resolved to bytes: a pointer base (and per-row stride), or an int source.
  struct Arg {
    LaunchArg::Kind kind = LaunchArg::Kind::Null;
    uint64_t base = 0, row_stride = 0;
    int value = 0;
  };
  /// Calls `f(kernel, grid, smem, args, sizes, count)` for every kernel launch of entries
  /// [begin, end) of the step's launches (the masked pick's with `masked`) and `lib(library,
  /// rows, args, count)` for every library call, with argument bytes in a buffer on the stack (no
  /// allocation); returns the number of launches and calls.
  template <typename F, typename L>
  size_t for_each(bool masked, const StepShape& shape, size_t begin, size_t end, F&& f,
                  L&& lib) const;
  /// run() over the step's launches, or over the masked pick's.
  size_t launch(bool masked, const StepShape& shape, cudaStream_t stream, size_t begin,
                size_t end) const;
  std::vector<LaunchRecord> record_launches(bool masked, const StepShape& shape, size_t begin,
                                            size_t end) const;

  LaunchTable table_;
  std::vector<std::vector<Arg>> args_;
  std::vector<std::vector<Arg>> masked_args_; ///< the masked pick's
  std::vector<LoadedKernel> kernels_;
  const Blas* blas_ = nullptr;
  bool dependent_ = false;
  std::string repeat_;
  int repeat_times_ = 1;
};

} // namespace xserv::runtime
