// micro_batches(): how rank 0 cuts a pipelined step, checked piece by piece; how many pieces
// and which transport rank 0 picks by default.
#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include "engine/pipeline/coordinator.h"
#include "engine/pipeline/pipeline_model.h"
#include "engine/pipeline/stage.h"
#include "tests/step_input.h"

using xserv::engine::pipeline::micro_batch_count;
using xserv::engine::pipeline::micro_batches;
using xserv::engine::pipeline::MicroBatch;
using xserv::engine::pipeline::PipelineOptions;
using xserv::engine::pipeline::resolve_transport;
using xserv::models::StepInput;

namespace {

/// Pools of 5 rows of 64 positions (and the null block).
const xserv::models::KvGeometry kKv{16, 4, 0, 21, 0};

StepInput make_step(std::vector<std::vector<int32_t>> tokens, std::vector<int32_t> ctx,
                    const std::vector<int32_t>& rows) {
  return xserv::testing::make_step(std::move(tokens), std::move(ctx), rows, kKv);
}

/// Every token of `in` appears once, in order, with its position (ctx + offset) and cache row.
void check_covers(const StepInput& in, const std::vector<MicroBatch>& mbs) {
  std::vector<std::vector<int32_t>> seen(in.tokens.size());
  std::vector<int> lasts(in.tokens.size(), 0);
  for (const MicroBatch& mb : mbs) {
    REQUIRE(mb.in.tokens.size() == mb.seq.size());
    REQUIRE(mb.last.size() == mb.seq.size());
    for (size_t i = 0; i < mb.seq.size(); ++i) {
      const size_t b = mb.seq[i];
      CHECK(mb.in.block_tables[i] == in.block_tables[b]);
      // The piece continues where the sequence's previous pieces ended.
      CHECK(mb.in.ctx_lens[i] == in.ctx_lens[b] + static_cast<int32_t>(seen[b].size()));
      seen[b].insert(seen[b].end(), mb.in.tokens[i].begin(), mb.in.tokens[i].end());
      lasts[b] += mb.last[i];
      CHECK(mb.last[i] == (seen[b].size() == in.tokens[b].size()));
    }
  }
  for (size_t b = 0; b < in.tokens.size(); ++b) {
    CHECK(seen[b] == in.tokens[b]);
    CHECK(lasts[b] == 1);
  }
}

} // namespace

TEST_CASE("micro_batches cuts a decode step into groups of sequences") {
  const StepInput in = make_step({{1}, {2}, {3}, {4}, {5}}, {10, 0, 7, 3, 99}, {4, 3, 2, 1, 0});
  const auto mbs = micro_batches(in, 2);
  REQUIRE(mbs.size() == 2);
  CHECK(mbs[0].in.tokens.size() == 3); // 5 tokens: 3 + 2
  CHECK(mbs[1].in.tokens.size() == 2);
  check_covers(in, mbs);
}

TEST_CASE("micro_batches splits a long prompt into consecutive pieces of one sequence") {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 10; ++i)
    prompt.push_back(100 + i);
  const StepInput in = make_step({prompt}, {5}, {2});
  const auto mbs = micro_batches(in, 3);
  REQUIRE(mbs.size() == 3);
  CHECK(mbs[0].in.tokens[0].size() == 4); // 10 tokens: 4 + 3 + 3
  CHECK(mbs[1].in.ctx_lens[0] == 9);
  CHECK(mbs[2].in.ctx_lens[0] == 12);
  check_covers(in, mbs);
}

TEST_CASE("micro_batches: mixed prompts, more parts than tokens, one part") {
  const StepInput in = make_step({{1, 2, 3}, {4}, {5, 6, 7, 8, 9}}, {0, 4, 2}, {0, 1, 2});
  for (int parts : {1, 2, 3, 4, 9, 50}) {
    CAPTURE(parts);
    const auto mbs = micro_batches(in, parts);
    REQUIRE(mbs.size() == static_cast<size_t>(std::min(parts, 9)));
    for (const MicroBatch& mb : mbs) { // token counts differ by at most one
      size_t n = 0;
      for (const auto& t : mb.in.tokens)
        n += t.size();
      CHECK(n >= 9 / mbs.size());
      CHECK(n <= (9 + mbs.size() - 1) / mbs.size());
    }
    check_covers(in, mbs);
  }
  CHECK(micro_batches(in, 0).size() == 1); // 0 or less: the whole step
}

TEST_CASE("micro_batch_count: prompt steps split one per rank, decode steps stay whole") {
  // A decode step (one token per sequence) stays whole: each micro-batch would read the stage's
  // weights again (20b pp 2, B32 on two H200s: 1,467 tok/s in 2 micro-batches).
  CHECK(micro_batch_count(0, 32, false, 2) == 1);
  CHECK(micro_batch_count(0, 512, true, 2) == 2);
  CHECK(micro_batch_count(0, 512, true, 4) == 4);
  CHECK(micro_batch_count(0, 3, true, 2) == 1); // fewer than two tokens per rank
  CHECK(micro_batch_count(0, 4, true, 2) == 2);
  CHECK(micro_batch_count(3, 32, false, 2) == 3); // asked for: always
}

TEST_CASE("resolve_transport: NCCL with a GPU per rank, else TCP with the reason") {
  PipelineOptions cuda;
  cuda.backend = "cuda";
  std::string why;
  CHECK(resolve_transport(cuda, 2, 2, true, &why) == "nccl");
  CHECK(why.empty());
  CHECK(resolve_transport(cuda, 4, 2, true, &why) == "tcp");
  CHECK(why == "4 ranks share 2 GPU(s) and NCCL needs a GPU per rank");
  why = "libnccl.so.2: cannot open shared object file";
  CHECK(resolve_transport(cuda, 2, 2, false, &why) == "tcp");
  CHECK(why == "libnccl.so.2: cannot open shared object file");
  cuda.coordinator = "0.0.0.0:29500"; // workers on other hosts bring their own GPUs
  CHECK(resolve_transport(cuda, 4, 1, true, &why) == "nccl");
  PipelineOptions cpu;
  CHECK(resolve_transport(cpu, 2, 0, false, &why) == "tcp");
  CHECK(why == "the cpu backend has no GPU buffers to send");
  cuda.transport = "tcp"; // asked for: always
  CHECK(resolve_transport(cuda, 2, 2, true, &why) == "tcp");
  cpu.transport = "nccl";
  CHECK(resolve_transport(cpu, 2, 0, false, &why) == "nccl"); // the engine refuses it, by name
}
