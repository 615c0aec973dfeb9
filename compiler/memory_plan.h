// Memory planning: liveness of every activation buffer and their packing into one arena.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace xserv::compiler {

/// One activation buffer: the value that defines it, where it lives in the arena, and the node
/// interval [first, last] during which it must stay intact.
struct PlannedBuffer {
  ir::ValueId value = -1;
  int result = 0;     ///< which result of a multi-result node
  int64_t offset = 0; ///< bytes from the arena start, aligned
  int64_t bytes = 0;  ///< size at the bound dims
  int32_t first = 0;  ///< defining node
  int32_t last = 0;   ///< last node that reads it (or the graph end for outputs)
};

struct MemoryPlan {
  std::vector<PlannedBuffer> buffers;
  /// For every value (and result), the index into `buffers` holding it, or -1 for values with
  /// no activation buffer (weights, caches, kv_write). Reshape and extract alias their input.
  std::vector<std::vector<int32_t>> buffer_of;
  int64_t arena_bytes = 0; ///< size of the packed arena
  int64_t peak_live = 0;   ///< most bytes live at one node: a lower bound for any packing
  int64_t unpacked = 0;    ///< sum of all buffers: what one allocation each would take
};

/// Plans the activation memory of `g` at the largest step it must serve: dynamic dims bound by
/// `dims` (T, B; the cache dims N, S are not needed). Algorithm:
///   1. Every node result that is neither a weight, a cache nor a cache write is a buffer;
///      reshape and extract results alias the buffer they read.
///   2. Liveness: a buffer lives from its defining node to its last reader; graph outputs and
///      params live for the whole step (params are written before it starts).
///   3. Packing, largest first: each buffer takes the lowest aligned offset at which it overlaps
///      no already-placed buffer whose lifetime intersects its own.
/// Throws xserv::Error when a dynamic dim has no binding.
MemoryPlan plan_memory(const ir::Graph& g, const ir::DimBindings& dims, int64_t alignment = 256);

/// A one-paragraph report: buffers, arena, peak and the unpacked total, in MiB.
std::string describe(const MemoryPlan& plan);

} // namespace xserv::compiler
