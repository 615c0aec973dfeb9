// The Engine over the CUDA model's paged KV pools, on the tiny model (a sliding window of 8 and a
// full-attention layer) with split gemm activations (fp32-grade): a request's tokens and logits
// rows with a prefix-cache hit, after a preemption, and in each of n = 4 choices at temperature
// 0, against the same request run alone without the prefix cache. The bar is identical tokens
// and logits within engine_gpu_test.cpp's batch-invariance bound (1e-4 relative L2 in split
// mode): the kernels' sums still depend on a step's size (a gemm's rows on M, decode GEMVs on
// the batch), so the blocks another request's prefill wrote, or a step of 4 choices, differ from
// the plain run in the last bits; how many rows are bitwise is reported. Then pools sized from
// GPU memory.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>

#include "engine/engine.h"
#include "models/config.h"
#include "models/synth.h"
#include "tests/compiled_model.h"
#include "tests/test_util.h"

namespace {

using namespace xserv;
using engine::Engine;
using engine::EngineOptions;
using engine::Event;
using engine::Request;
using xserv::testing::quiet;
using xserv::testing::source_dir;

std::vector<int32_t> random_prompt(std::mt19937_64& rng, size_t len) {
  std::uniform_int_distribution<int32_t> id(0, 199997);
  std::vector<int32_t> p(len);
  for (int32_t& x : p)
    x = id(rng);
  return p;
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

/// Runs `reqs` on `e` (request i added before step joins[i]) to the end; each (request,
/// choice)'s tokens and logits rows.
std::map<std::pair<size_t, int>, Outcome> run(Engine& e, const std::vector<Request>& reqs,
                                              const std::vector<int>& joins) {
  std::map<engine::RequestId, size_t> index;
  std::map<std::pair<size_t, int>, Outcome> out;
  for (int k = 0; k <= *std::max_element(joins.begin(), joins.end()) || !e.idle(); ++k) {
    for (size_t i = 0; i < reqs.size(); ++i)
      if (joins[i] == k)
        index[e.add(reqs[i])] = i;
    for (Event& ev : e.step())
      if (ev.token >= 0) {
        Outcome& o = out[{index.at(ev.id), ev.choice}];
        o.tokens.push_back(ev.token);
        o.logits.push_back(std::move(ev.logits));
      }
  }
  return out;
}

Outcome plain(engine::Model& m, const Request& r) {
  EngineOptions o;
  o.prefix_caching = false;
  Engine e(m, o);
  return run(e, {r}, {0}).at({0, 0});
}

/// Rows of `got` bitwise equal to `want`'s, and the worst relative L2 of the others.
struct Compared {
  size_t rows = 0, bitwise = 0;
  double worst = 0;
};
Compared compare(const Outcome& got, const Outcome& want) {
  Compared c;
  c.rows = std::min(got.logits.size(), want.logits.size());
  for (size_t t = 0; t < c.rows; ++t) {
    c.bitwise += got.logits[t] == want.logits[t];
    c.worst = std::max(c.worst, xserv::testing::rel_l2(got.logits[t], want.logits[t]));
  }
  return c;
}

/// The batch-invariance bound of split mode (engine_gpu_test.cpp).
constexpr double kSplitBound = 1e-4;

} // namespace

TEST_CASE("gpu: paged KV, a prefix hit, a preemption and n = 4 give the plain run's logits") {
  XSERV_REQUIRE_GPU();
  xserv::testing::TempDir tmp("engine_kv_gpu");
  models::SynthOptions so;
  so.seed = 7;
  models::synth_checkpoint(models::ModelConfig::load(source_dir() / "examples/tiny/config.json"),
                           tmp.path, so);
  testing::GraphModelOptions opts = quiet();
  opts.gemm_split = true;
  // Pools of blocks of 16: one sequence of 512 positions (32 blocks) and the null block; the
  // window pool's default.
  opts.kv_blocks = 32 + 1;
  const auto model = testing::graph_cuda_model(tmp.path, 8, 512, nullptr, opts);
  std::mt19937_64 rng(21);
  Request r;
  r.prompt = random_prompt(rng, 160); // 10 whole blocks, past the window of 8
  r.max_tokens = 24;
  r.return_logits = true;
  const Outcome want = plain(*model, r);
  REQUIRE(want.logits.size() == 24);

  { // A prefix hit: another request with the first 128 positions of the prompt ran first.
    Engine e(*model);
    Request s = r;
    s.prompt.resize(128);
    const std::vector<int32_t> tail = random_prompt(rng, 20);
    s.prompt.insert(s.prompt.end(), tail.begin(), tail.end());
    s.max_tokens = 4;
    run(e, {s}, {0});
    const Outcome hit = run(e, {r}, {0}).at({0, 0});
    const Compared c = compare(hit, want);
    MESSAGE("prefix hit of " << e.stats().prefix_hits << " positions: " << c.bitwise << " of "
                             << c.rows << " logits rows bitwise, worst relative L2 " << c.worst);
    CHECK(e.stats().prefix_hits == 128);
    CHECK(hit.tokens == want.tokens);
    CHECK(c.rows == 24);
    CHECK(c.worst < kSplitBound);
  }
  { // n = 4 at temperature 0: the prompt once, the choices forked (its last block is whole:
    // 160 positions; the first decode then opens a block of each choice's own).
    Engine e(*model);
    Request n4 = r;
    n4.n = 4;
    const auto out = run(e, {n4}, {0});
    for (int c = 0; c < 4; ++c) {
      CAPTURE(c);
      const Outcome& o = out.at({0, c});
      const Compared cmp = compare(o, want);
      MESSAGE("n = 4, choice " << c << ": " << cmp.bitwise << " of " << cmp.rows
                               << " logits rows bitwise, worst relative L2 " << cmp.worst);
      CHECK(o.tokens == want.tokens);
      CHECK(cmp.rows == 24);
      CHECK(cmp.worst < kSplitBound);
      CHECK(o.logits.front() == want.logits.front()); // the prompt's row: the very same step
    }
    CHECK(e.stats().prompt_tokens == 160);
  }
  { // A preemption: an older request of 300 + 30 positions and r (160 + 24) decode side by
    // side until the older one needs its 21st block (position 320) and the 32 blocks are r's
    // and its: r, the newest, is preempted. Its 11 whole blocks stay cached (the older one
    // needs no more), so when the older one finishes r comes back from them and feeds its last
    // generated tokens back one a step.
    Engine e(*model);
    Request older;
    older.prompt = random_prompt(rng, 300);
    older.max_tokens = 30;
    const auto out = run(e, {older, r}, {0, 0});
    const Outcome& got = out.at({1, 0});
    const Compared c = compare(got, want);
    MESSAGE(e.stats().preemptions << " preemptions: " << c.bitwise << " of " << c.rows
                                  << " logits rows bitwise, worst relative L2 " << c.worst);
    CHECK(e.stats().preemptions > 0);
    CHECK(got.tokens == want.tokens);
    CHECK(c.rows == 24);
    CHECK(c.worst < kSplitBound);
  }
}

TEST_CASE("gpu: KV pools sized from GPU memory, and a budget too small is refused") {
  XSERV_REQUIRE_GPU();
  xserv::testing::TempDir tmp("engine_kv_gpu_mem");
  models::SynthOptions so;
  so.seed = 8;
  models::synth_checkpoint(models::ModelConfig::load(source_dir() / "examples/tiny/config.json"),
                           tmp.path, so);
  testing::GraphModelOptions opts = quiet();
  // The tiny model's full layer: 2 kv heads x 16 dims x (K, V) x fp32 = 256 bytes a position,
  // 4 KiB a block: 8 MiB less the window pool is some 1,850 blocks.
  opts.kv_memory = uint64_t(8) << 20;
  const auto m = testing::graph_cuda_model(tmp.path, 16, 1024, nullptr, opts);
  const models::KvGeometry& g = m->kv_geometry();
  MESSAGE("8 MiB of KV: " << g.blocks << " blocks of " << g.block_size << " positions, "
                          << g.window_blocks << " window blocks");
  CHECK(g.blocks > 16 * g.table_blocks); // more than fixed rows of max_seq would hold
  CHECK(g.blocks < 2048);
  CHECK(g.window_blocks > 0);
  Engine e(*m);
  std::mt19937_64 rng(5);
  std::vector<Request> reqs;
  for (int i = 0; i < 40; ++i) { // more requests than the batch: they queue, none fails
    Request q;
    q.prompt = random_prompt(rng, size_t(20 + i));
    q.max_tokens = 8;
    reqs.push_back(q);
  }
  const auto out = run(e, reqs, std::vector<int>(reqs.size(), 0));
  CHECK(out.size() == 40);
  CHECK(e.stats().finished_length == 40);

  opts.kv_memory = 1 << 16; // 64 KiB: not one sequence of 1024 positions
  CHECK_THROWS_WITH_AS(testing::graph_cuda_model(tmp.path, 16, 1024, nullptr, opts),
                       doctest::Contains("cannot hold one sequence of 1024 positions"), Error);
  opts.kv_memory = 0;
  opts.gpu_memory_utilization = 0.5;
  const auto half = testing::graph_cuda_model(tmp.path, 16, 1024, nullptr, opts);
  const auto [free_b, total_b] = runtime::device_memory();
  MESSAGE("--gpu-memory-utilization 0.5: " << half->kv_geometry().blocks << " blocks, "
                                           << double(free_b) / (1 << 30) << " GiB left free of "
                                           << double(total_b) / (1 << 30));
  // Far more than four times max_batch sequences of max_seq would need: capped there.
  CHECK(half->kv_geometry().blocks == 4 * 16 * g.table_blocks + 1);
  CHECK(double(free_b) > 0.4 * double(total_b)); // what it left to others
}
