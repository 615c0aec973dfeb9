// Steps mixing decodes and prompt chunks (PlanLaunch::part): attention runs the decode kernel
// over the step's leading decodes and the prompt kernel over the rows after them, its per-token
// pointers advanced past the decodes and its per-sequence ones (context lengths, block tables)
// not; a step without decodes, or one of decodes alone, launches as before. Recorded from the
// tiny config's launch table (no GPU: the executor's argument bytes are the check).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.h"
#include "runtime/executor.h"
#include "tests/codegen/tiny_lowering.h"

using namespace xserv;

namespace {

constexpr int kSeqs = 160;
constexpr int64_t kMaxSeq = 4096;

struct Tiny {
  models::ModelConfig cfg;
  runtime::LaunchTable table;
};

Tiny lower_tiny(bool split) {
  Tiny t{testing::tiny_config(), {}};
  codegen::LoweringContext ctx;
  ctx.gemm_split = split;
  ctx.dense_cublas = !split;
  t.table = testing::lower_tiny(testing::tiny_graph(), ctx, kSeqs, kMaxSeq);
  return t;
}

/// A step's launches of kernels whose name starts with `prefix`.
std::vector<runtime::LaunchRecord>
launches_of(const runtime::LaunchTable& t, const runtime::StepShape& s, const std::string& prefix) {
  const runtime::Executor ex(t, runtime::placeholder_bindings(t));
  std::vector<runtime::LaunchRecord> out;
  for (runtime::LaunchRecord& r : ex.record(s))
    if (r.kernel >= 0 && t.kernels.at(size_t(r.kernel)).name.rfind(prefix, 0) == 0)
      out.push_back(std::move(r));
  return out;
}

uint64_t pointer(const runtime::LaunchRecord& r, size_t i) {
  REQUIRE(r.args.at(i).size() == 8);
  uint64_t p = 0;
  std::memcpy(&p, r.args[i].data(), 8);
  return p;
}

} // namespace

TEST_CASE("a step mixing decodes and prompt chunks: the decode kernel over the decodes, the "
          "prompt kernel over the rest from the first chunk's row") {
  for (bool split : {false, true}) {
    CAPTURE(split);
    const Tiny t = lower_tiny(split);
    const int layers = int(t.cfg.num_hidden_layers);
    const uint64_t q_row = uint64_t(t.cfg.num_attention_heads) * t.cfg.head_dim * 4,
                   kv_row = uint64_t(t.cfg.num_key_value_heads) * t.cfg.head_dim * 4;
    const int group = int(t.cfg.num_attention_heads / t.cfg.num_key_value_heads);
    const int qt = 128 / group; // the prompt kernel's query tokens a block
    // 64 decodes at depth ~600 and a 136-token chunk of one more sequence.
    const runtime::StepShape mixed{200, 65, 700, 64}, unknown{200, 65, 700, 0};
    const auto dec = launches_of(t.table, mixed, "attention_decode_mma");
    const auto pre = launches_of(t.table, mixed, "attention_prefill_mma");
    const auto pre_all = launches_of(t.table, unknown, "attention_prefill_mma");
    const auto comb = launches_of(t.table, mixed, "attention_combine");
    REQUIRE(dec.size() == size_t(layers));
    REQUIRE(comb.size() == size_t(layers));
    REQUIRE(pre.size() == size_t(layers));
    REQUIRE(pre_all.size() == size_t(layers));
    CHECK(launches_of(t.table, unknown, "attention_decode_mma").empty());
    for (int l = 0; l < layers; ++l) {
      CAPTURE(l);
      CHECK(dec[size_t(l)].grid[1] == 64u); // a token a block row, every decode
      CHECK(pre[size_t(l)].grid[1] == unsigned((136 + qt - 1) / qt));
      CHECK(pre_all[size_t(l)].grid[1] == unsigned((200 + qt - 1) / qt));
      // q, k, v, k_cache, v_cache, sinks, positions, token_seq, ctx_lens, block_table, out,
      // tokens: the per-token ones advanced by 64 rows, the rest as in the whole step.
      const std::vector<uint64_t> advance = {64 * q_row, 64 * kv_row, 64 * kv_row, 0, 0,         0,
                                             64 * 4,     64 * 4,      0,           0, 64 * q_row};
      const auto& a = pre[size_t(l)];
      const auto& b = pre_all[size_t(l)];
      REQUIRE(a.args.size() == advance.size() + 1);
      for (size_t i = 0; i < advance.size(); ++i) {
        CAPTURE(i);
        CHECK(pointer(a, i) == pointer(b, i) + advance[i]);
      }
      int32_t rows = 0;
      std::memcpy(&rows, a.args.back().data(), 4);
      CHECK(rows == 136);
      // The decode kernel's out is the step's (its rows come first), its chunks a block each
      // (64 x 2 kv heads is under 256 blocks), folded by the combine into the same rows.
      CHECK(pointer(dec[size_t(l)], 10) == pointer(b, 10));
      CHECK(dec[size_t(l)].grid[2] > 1u);
      const auto& c = comb.at(size_t(l));
      int32_t splits = 0;
      std::memcpy(&splits, c.args.at(3).data(), 4);
      CHECK(unsigned(splits) == dec[size_t(l)].grid[2]);
      CHECK(pointer(c, 4) == pointer(b, 10));
    }
    // A step of decodes alone launches no prompt kernel; steps of at most 64 tokens split
    // nothing (the decode kernel serves every token there).
    CHECK(launches_of(t.table, {80, 80, 700, 80}, "attention_prefill_mma").empty());
    CHECK(launches_of(t.table, {80, 80, 700, 80}, "attention_decode_mma").size() == size_t(layers));
    for (const auto& r : launches_of(t.table, {60, 9, 700, 8}, "attention_decode_mma"))
      CHECK(r.grid[1] == 60u);
    // 128 decodes: 256 blocks a split, so each block all its token's chunks and no combine.
    const runtime::StepShape many{400, 129, 700, 128};
    const auto dec_many = launches_of(t.table, many, "attention_decode_mma");
    REQUIRE(dec_many.size() == size_t(layers));
    for (const auto& r : dec_many) {
      CHECK(r.grid[1] == 128u);
      CHECK(r.grid[2] == 1u);
    }
    CHECK(launches_of(t.table, many, "attention_combine").empty());
    for (const auto& r : launches_of(t.table, many, "attention_prefill_mma"))
      CHECK(r.grid[1] == unsigned((272 + qt - 1) / qt));
    // Only prompt rows after the decodes: none of the decode part's launches.
    CHECK(launches_of(t.table, {200, 1, 700, 0}, "attention_decode_mma").empty());
    CHECK(launches_of(t.table, {200, 1, 700, 0}, "attention_combine").empty());
  }
}

TEST_CASE("launch tables: a part outside 0..2, on a library call or over sequences is refused") {
  const Tiny t = lower_tiny(false);
  runtime::LaunchTable bad = t.table;
  for (runtime::PlanLaunch& l : bad.launches)
    if (l.part != 0) {
      l.part = 3;
      break;
    }
  CHECK_THROWS_WITH_AS(runtime::Executor(bad, runtime::placeholder_bindings(bad)),
                       doctest::Contains("serves part 3 of the step's rows"), Error);
  bad = t.table;
  bool found = false;
  for (runtime::PlanLaunch& l : bad.launches)
    if (l.library >= 0) {
      l.part = 1;
      found = true;
      break;
    }
  REQUIRE(found);
  CHECK_THROWS_WITH_AS(runtime::Executor(bad, runtime::placeholder_bindings(bad)),
                       doctest::Contains("of kernels over tokens only"), Error);
  bad = t.table;
  found = false;
  for (runtime::PlanLaunch& l : bad.launches)
    if (l.seq_rows && l.library < 0) {
      l.part = 2;
      found = true;
      break;
    }
  REQUIRE(found);
  CHECK_THROWS_WITH_AS(runtime::Executor(bad, runtime::placeholder_bindings(bad)),
                       doctest::Contains("serves part 2"), Error);
}

TEST_CASE("decode attention of steps above 64 tokens in other warps a block: their own kernel, "
          "the same launches") {
  Tiny base = lower_tiny(false);
  Tiny t{testing::tiny_config(), {}};
  codegen::LoweringContext ctx;
  ctx.gemm_split = false;
  ctx.dense_cublas = true;
  ctx.many_token_decode_warps = 1; // head_dim 16: one pair of output tiles, one warp
  t.table = testing::lower_tiny(testing::tiny_graph(), ctx, kSeqs, kMaxSeq);
  const int layers = int(t.cfg.num_hidden_layers);
  const auto name = [&](const runtime::LaunchRecord& r) {
    return t.table.kernels.at(size_t(r.kernel)).name;
  };
  // 128 decodes alone (each block all its token's chunks), and the decode part of a mixed step
  for (const runtime::StepShape& s :
       {runtime::StepShape{128, 128, 700, 128}, runtime::StepShape{400, 129, 700, 128}}) {
    const auto dec = launches_of(t.table, s, "attention_decode_mma");
    const auto old = launches_of(base.table, s, "attention_decode_mma");
    REQUIRE(dec.size() == size_t(layers));
    REQUIRE(old.size() == dec.size());
    for (size_t i = 0; i < dec.size(); ++i) {
      CHECK(name(dec[i]).find("_wp1") != std::string::npos);
      CHECK(dec[i].block == 32u);
      CHECK(dec[i].grid == old[i].grid);
      CHECK(dec[i].args == old[i].args);
    }
  }
  // Steps of up to 64 tokens keep the lowering's kernel (split over chunks).
  for (const auto& r : launches_of(t.table, {60, 9, 700, 8}, "attention_decode_mma"))
    CHECK(name(r).find("_wp") == std::string::npos);
}
