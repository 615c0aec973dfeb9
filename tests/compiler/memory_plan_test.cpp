// Memory planning: liveness, aliasing, and a packing in which no two live buffers overlap.
#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include "base/error.h"
#include "compiler/memory_plan.h"
#include "models/config.h"
#include "models/gpt_oss.h"
#include "tests/test_util.h"

using namespace xserv;

namespace {

/// No two buffers whose lifetimes intersect share a byte.
bool packing_is_sound(const compiler::MemoryPlan& p) {
  for (size_t i = 0; i < p.buffers.size(); ++i)
    for (size_t j = i + 1; j < p.buffers.size(); ++j) {
      const auto &a = p.buffers[i], &b = p.buffers[j];
      const bool live_together = a.first <= b.last && b.first <= a.last;
      const bool overlap = a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
      if (live_together && overlap)
        return false;
    }
  return true;
}

} // namespace

TEST_CASE("a chain reuses memory: two buffers' worth of arena") {
  ir::Graph g = ir::parse(R"(
    %x = param() {name="x"} : f32[T,64]
    %ln = weight() {name="ln"} : bf16[64]
    %a = rms_norm(%x, %ln) {eps=1e-05} : f32[T,64]
    %b = rms_norm(%a, %ln) {eps=1e-05} : f32[T,64]
    %c = rms_norm(%b, %ln) {eps=1e-05} : f32[T,64]
    %d = rms_norm(%c, %ln) {eps=1e-05} : f32[T,64]
    return %d
  )");
  auto p = compiler::plan_memory(g, {{"T", 4}}, 256);
  REQUIRE(p.buffers.size() == 5); // x, a, b, c, d; the weight has none
  CHECK(p.buffer_of[1][0] == -1);
  for (const auto& b : p.buffers)
    CHECK(b.bytes == 1024); // 4 x 64 x 4 bytes
  // x (a param) lives all step; a..d each overlap only their neighbour.
  CHECK(p.buffers[0].first == 0);
  CHECK(p.buffers[0].last == 6);
  CHECK(p.buffers[1].first == 2);
  CHECK(p.buffers[1].last == 3);
  CHECK(p.buffers[4].last == 6); // the output lives to the end
  CHECK(p.arena_bytes == 3 * 1024);
  CHECK(p.peak_live == 3 * 1024);
  CHECK(p.unpacked == 5 * 1024);
  CHECK(packing_is_sound(p));
}

TEST_CASE("reshape and extract alias the buffer they read and extend its life") {
  ir::Graph g = ir::parse(R"(
    %x = param() {name="x"} : f32[T,8]
    %r = router_topk(%x) {k=2} : (f32[T,2], i32[T,2])
    %w = extract(%r) {index=0} : f32[T,2]
    %i = extract(%r) {index=1} : i32[T,2]
    %v = reshape(%x) : f32[T,2,4]
    %y = reshape(%w) : f32[T,2,1]
    return %y, %i
  )");
  auto p = compiler::plan_memory(g, {{"T", 3}}, 16);
  REQUIRE(p.buffers.size() == 3);                // x, and the two results of router_topk
  CHECK(p.buffer_of[4][0] == p.buffer_of[0][0]); // %v views %x
  CHECK(p.buffer_of[2][0] == p.buffer_of[1][0]);
  CHECK(p.buffer_of[3][0] == p.buffer_of[1][1]);
  CHECK(p.buffer_of[5][0] == p.buffer_of[1][0]);
  CHECK(p.buffers[static_cast<size_t>(p.buffer_of[1][0])].last == 6); // output through %y
  CHECK(packing_is_sound(p));
}

TEST_CASE("unbound dynamic dims are a clear error") {
  ir::Graph g = ir::parse(R"(
    %x = param() {name="x"} : f32[T,8]
    return %x
  )");
  CHECK_THROWS_WITH_AS(compiler::plan_memory(g, {}), doctest::Contains("'T' has no value"), Error);
}

TEST_CASE("whole models pack soundly into far less than their unpacked size") {
  auto tiny = models::ModelConfig::load(testing::source_dir() / "examples/tiny");
  auto p = compiler::plan_memory(models::build_gpt_oss(tiny), {{"T", 512}, {"B", 8}, {"MB", 16}});
  CHECK(packing_is_sound(p));
  CHECK(p.arena_bytes >= p.peak_live);
  CHECK(p.arena_bytes < p.unpacked);
  // Greedy packing lands within 25% of the lower bound (the most bytes live at one node).
  CHECK(static_cast<double>(p.arena_bytes) <= 1.25 * static_cast<double>(p.peak_live));
  auto big = models::ModelConfig::load(testing::source_dir() / "examples/gpt-oss-120b");
  auto q = compiler::plan_memory(models::build_gpt_oss(big), {{"T", 2048}, {"B", 64}, {"MB", 512}});
  CHECK(packing_is_sound(q));
  CHECK(q.arena_bytes >= q.peak_live);
  // Live at once at most: the residual, a norm output, q/k/v, attention and the MoE scratch
  // of one layer; never more than a handful of layers' worth.
  CHECK(q.arena_bytes < q.unpacked / 10);
  CHECK(static_cast<double>(q.arena_bytes) <= 1.25 * static_cast<double>(q.peak_live));
  MESSAGE("120b at T=2048: " << compiler::describe(q));
}

namespace {

/// The packing memory_plan.cpp states, done the direct way: every buffer against every placed
/// one (quadratic), and peak live bytes by scanning every node.
void reference_packing(compiler::MemoryPlan& p) {
  std::vector<size_t> order(p.buffers.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return p.buffers[a].bytes > p.buffers[b].bytes; });
  std::vector<size_t> placed;
  p.arena_bytes = 0;
  for (size_t idx : order) {
    auto& b = p.buffers[idx];
    std::vector<std::pair<int64_t, int64_t>> taken;
    for (size_t q : placed) {
      const auto& o = p.buffers[q];
      if (o.first <= b.last && b.first <= o.last)
        taken.emplace_back(o.offset, o.offset + o.bytes);
    }
    std::sort(taken.begin(), taken.end());
    int64_t offset = 0;
    for (const auto& [lo, hi] : taken) {
      if (offset + b.bytes <= lo)
        break;
      offset = std::max(offset, hi);
    }
    b.offset = offset;
    p.arena_bytes = std::max(p.arena_bytes, offset + b.bytes);
    placed.push_back(idx);
  }
  p.peak_live = 0;
  int32_t end = 0;
  for (const auto& b : p.buffers)
    end = std::max(end, b.last);
  for (int32_t t = 0; t <= end; ++t) {
    int64_t live = 0;
    for (const auto& b : p.buffers)
      if (b.first <= t && t <= b.last)
        live += b.bytes;
    p.peak_live = std::max(p.peak_live, live);
  }
}

} // namespace

TEST_CASE("the linear-time packing places every buffer where the quadratic statement does") {
  // Long-lived buffers (params, outputs: whole-step lifetimes) and short ones, many layers, a
  // prefill and a decode binding.
  models::ModelConfig c =
      models::ModelConfig::load(testing::source_dir() / "examples/tiny/config.json");
  c.num_hidden_layers = 40;
  c.sliding.assign(40, false);
  for (int64_t l = 0; l < 40; l += 2)
    c.sliding[size_t(l)] = true;
  const ir::Graph g = models::build_gpt_oss(c, {});
  for (int64_t tokens : {1, 7, 512}) {
    CAPTURE(tokens);
    const compiler::MemoryPlan fast = compiler::plan_memory(
        g, {{ir::dims::kTokens, tokens}, {ir::dims::kSeqs, 4}, {ir::dims::kTableBlocks, 16}});
    compiler::MemoryPlan slow = fast;
    reference_packing(slow);
    REQUIRE(fast.buffers.size() == slow.buffers.size());
    size_t moved = 0;
    for (size_t i = 0; i < fast.buffers.size(); ++i)
      moved += fast.buffers[i].offset != slow.buffers[i].offset;
    CHECK(moved == 0);
    CHECK(fast.arena_bytes == slow.arena_bytes);
    CHECK(fast.peak_live == slow.peak_live);
    CHECK(packing_is_sound(fast));
  }
}
