// Memory planning: liveness intervals, then greedy best-offset packing, largest buffers first.
#include "compiler/memory_plan.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "base/error.h"

namespace xserv::compiler {
namespace {

int64_t element_bytes(ir::DType t) {
  switch (t) {
  case ir::DType::BF16:
  case ir::DType::F16:
    return 2;
  case ir::DType::F32:
  case ir::DType::I32:
    return 4;
  case ir::DType::I64:
    return 8;
  case ir::DType::U8:
    return 1;
  case ir::DType::MXFP4:
    break;
  }
  XSERV_CHECK(false, "an activation cannot be mxfp4");
}

bool has_buffer(ir::Op op) {
  return op != ir::Op::Weight && op != ir::Op::Cache && op != ir::Op::KvWrite;
}

bool aliases_input(ir::Op op) {
  return op == ir::Op::Reshape || op == ir::Op::Extract || op == ir::Op::Send;
}

/// Inputs from outside the step (params, and what a pipeline stage receives) are written before
/// it starts and live through it.
bool external(ir::Op op) {
  return op == ir::Op::Param || op == ir::Op::Recv;
}

int64_t align_up(int64_t x, int64_t a) {
  return (x + a - 1) / a * a;
}

} // namespace

MemoryPlan plan_memory(const ir::Graph& g, const ir::DimBindings& dims, int64_t alignment) {
  MemoryPlan plan;
  plan.buffer_of.resize(g.size());
  const int32_t end = static_cast<int32_t>(g.size());
  // 1. Buffers, with aliases resolved to the buffer they view.
  for (size_t i = 0; i < g.size(); ++i) {
    const ir::Node& n = g.nodes[i];
    plan.buffer_of[i].assign(n.types.size(), -1);
    if (!has_buffer(n.op))
      continue;
    if (aliases_input(n.op)) {
      const auto& src = plan.buffer_of[static_cast<size_t>(n.inputs[0])];
      const size_t idx = n.op == ir::Op::Extract ? static_cast<size_t>(n.attr_int("index")) : 0;
      plan.buffer_of[i][0] = src.at(idx);
      continue;
    }
    for (size_t r = 0; r < n.types.size(); ++r) {
      int64_t numel = 1;
      for (int64_t d : ir::concrete(n.types[r].shape, dims))
        numel *= d;
      PlannedBuffer b;
      b.value = static_cast<ir::ValueId>(i);
      b.result = static_cast<int>(r);
      b.bytes = align_up(std::max<int64_t>(numel * element_bytes(n.types[r].dtype), 1), alignment);
      b.first = external(n.op) ? 0 : static_cast<int32_t>(i);
      b.last = external(n.op) ? end : static_cast<int32_t>(i);
      plan.buffer_of[i][r] = static_cast<int32_t>(plan.buffers.size());
      plan.buffers.push_back(b);
    }
  }
  // 2. Liveness: every read extends the life of the buffer read (through aliases).
  for (size_t i = 0; i < g.size(); ++i)
    for (ir::ValueId in : g.nodes[i].inputs)
      for (int32_t b : plan.buffer_of[static_cast<size_t>(in)])
        if (b >= 0)
          plan.buffers[static_cast<size_t>(b)].last =
              std::max(plan.buffers[static_cast<size_t>(b)].last, static_cast<int32_t>(i));
  for (ir::ValueId o : g.outputs)
    for (int32_t b : plan.buffer_of[static_cast<size_t>(o)])
      if (b >= 0)
        plan.buffers[static_cast<size_t>(b)].last = end;

  // 3. Packing, largest first (ties: earlier definition first, for determinism). The buffers
  //    alive at the same time as a new one are found through per-node lists of the short-lived
  //    buffers placed so far, plus one list of long-lived ones (params, outputs), so the cost is
  //    the sum of lifetimes, not buffers squared: compile time stays linear in layers.
  std::vector<size_t> order(plan.buffers.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return plan.buffers[a].bytes > plan.buffers[b].bytes;
  });
  constexpr int32_t kLongLife = 64;
  std::vector<std::vector<uint32_t>> alive_at(static_cast<size_t>(end) + 1);
  std::vector<uint32_t> long_lived;
  std::vector<size_t> seen(plan.buffers.size(), 0); // stamp: 1 + index in `order` of the query
  std::vector<std::pair<int64_t, int64_t>> taken;
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t idx = order[k];
    PlannedBuffer& b = plan.buffers[idx];
    // Intervals already taken by buffers alive at the same time, sorted by offset.
    taken.clear();
    auto consider = [&](uint32_t p) {
      const PlannedBuffer& o = plan.buffers[p];
      if (seen[p] == k + 1 || !(o.first <= b.last && b.first <= o.last))
        return;
      seen[p] = k + 1;
      taken.emplace_back(o.offset, o.offset + o.bytes);
    };
    for (uint32_t p : long_lived)
      consider(p);
    for (int32_t t = b.first; t <= b.last; ++t)
      for (uint32_t p : alive_at[static_cast<size_t>(t)])
        consider(p);
    std::sort(taken.begin(), taken.end());
    int64_t offset = 0;
    for (const auto& [lo, hi] : taken) {
      if (offset + b.bytes <= lo)
        break;
      offset = std::max(offset, hi);
    }
    b.offset = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + b.bytes);
    if (b.last - b.first >= kLongLife)
      long_lived.push_back(static_cast<uint32_t>(idx));
    else
      for (int32_t t = b.first; t <= b.last; ++t)
        alive_at[static_cast<size_t>(t)].push_back(static_cast<uint32_t>(idx));
  }
  // 4. Peak live bytes: a sweep over lifetime starts and ends.
  std::vector<int64_t> delta(static_cast<size_t>(end) + 2, 0);
  for (const auto& b : plan.buffers) {
    plan.unpacked += b.bytes;
    delta[static_cast<size_t>(std::max(b.first, 0))] += b.bytes;
    delta[static_cast<size_t>(std::min(b.last, end)) + 1] -= b.bytes;
  }
  int64_t live = 0;
  for (int32_t t = 0; t <= end; ++t)
    plan.peak_live = std::max(plan.peak_live, live += delta[static_cast<size_t>(t)]);
  return plan;
}

std::string describe(const MemoryPlan& plan) {
  const double mib = 1024.0 * 1024.0;
  return fmt::format("{} buffers in a {:.2f} MiB arena (peak live {:.2f} MiB, {:.2f} MiB unpacked)",
                     plan.buffers.size(), static_cast<double>(plan.arena_bytes) / mib,
                     static_cast<double>(plan.peak_live) / mib,
                     static_cast<double>(plan.unpacked) / mib);
}

} // namespace xserv::compiler
