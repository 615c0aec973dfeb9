// How the CUDA engine takes a step apart: limits checked with messages naming them, sub-steps
// of at most the arena's tokens with each sequence's pieces in order, and the input block layout.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "engine/step_split.h"
#include "models/gpt_oss.h"
#include "tests/step_input.h"

using xserv::engine::ParamLayout;
using xserv::engine::Piece;
using xserv::engine::split_step;
using xserv::engine::validate_step;
using xserv::models::StepInput;

namespace {

/// Pools of 2 rows of 16 positions in blocks of 4 after the null block, and a window of 5
/// (rings of 3 blocks).
const xserv::models::KvGeometry kKv{4, 4, 5, 9, 7};

StepInput make_step(std::vector<std::vector<int32_t>> tokens, std::vector<int32_t> ctx,
                    const std::vector<int32_t>& rows) {
  return xserv::testing::make_step(std::move(tokens), std::move(ctx), rows, kKv);
}

std::string error_of(const StepInput& in, int64_t batch, int64_t seq, int64_t vocab) {
  try {
    validate_step(in, batch, seq, vocab, kKv);
  } catch (const xserv::Error& e) {
    return e.what();
  }
  return "";
}

} // namespace

TEST_CASE("split_step: sub-steps of at most cap tokens, each sequence's pieces in order") {
  StepInput in;
  in.tokens = {{1, 2, 3, 4, 5}, {6}, {7, 8, 9}};
  in.ctx_lens = {0, 4, 10};
  const auto subs = split_step(in, 4);
  REQUIRE(subs.size() == 3); // 9 tokens in sub-steps of 4, 4, 1
  std::vector<size_t> next(3, 0), sizes;
  for (const auto& sub : subs) {
    size_t used = 0;
    for (const Piece& p : sub) {
      CHECK(p.start == next[p.seq]); // continues where the sequence's last piece ended
      next[p.seq] += p.len;
      used += p.len;
    }
    CHECK(used <= 4);
    sizes.push_back(used);
  }
  CHECK(sizes == std::vector<size_t>{4, 4, 1});
  CHECK(next == std::vector<size_t>{5, 1, 3});
  CHECK(split_step(in, 100).size() == 1);
  CHECK(split_step(in, 1).size() == 9);
}

TEST_CASE("validate_step names the limit a step breaks") {
  const int64_t batch = 2, seq = 16, vocab = 100;
  CHECK(error_of(make_step({{1}, {2}}, {0, 15}, {0, 1}), batch, seq, vocab).empty());
  CHECK(error_of(make_step({{1}, {2}, {3}}, {0, 0, 0}, {0, 1, 0}), batch, seq, vocab)
            .find("exceed the maximum batch of 2") != std::string::npos);
  CHECK(error_of(make_step({{1}, {2}}, {0}, {0, 1}), batch, seq, vocab).find("mismatched") !=
        std::string::npos);
  CHECK(error_of(make_step({{1}, {}}, {0, 0}, {0, 1}), batch, seq, vocab).find("has no tokens") !=
        std::string::npos);
  CHECK(error_of(make_step({{1, 2}}, {15}, {0}), batch, seq, vocab)
            .find("15 cached + 2 new tokens exceed the maximum sequence length of 16") !=
        std::string::npos);
  CHECK(error_of(make_step({{1}}, {-1}, {0}), batch, seq, vocab).find("sequence 0") !=
        std::string::npos);
  // The blocks a step reads and writes: every full-attention block up to its last position, the
  // sliding layers' window before its first new token and the step's own positions.
  StepInput hole = make_step({{1, 2}}, {9}, {1});
  hole.block_tables[0][1] = -1;
  CHECK(error_of(hole, batch, seq, vocab)
            .find("sequence 0: positions 4..7 need full-attention block 1, which is missing") !=
        std::string::npos);
  hole = make_step({{1, 2}}, {9}, {1});
  hole.block_tables[0][2] = 9;
  CHECK(error_of(hole, batch, seq, vocab).find("which is block 9 (the pool has 9 blocks)") !=
        std::string::npos);
  // Block copies: within the pool, never the null block, never onto themselves.
  StepInput copy = make_step({{1}}, {0}, {0});
  copy.copies = {{2, 3, false}, {1, 6, true}};
  CHECK(error_of(copy, batch, seq, vocab).empty());
  copy.copies = {{2, 0, false}};
  CHECK(error_of(copy, batch, seq, vocab)
            .find("a copy of full-attention block 2 to block 0 (the pool has 9 blocks, block 0 "
                  "the null block)") != std::string::npos);
  copy.copies = {{1, 7, true}};
  CHECK(error_of(copy, batch, seq, vocab).find("sliding-window block 1 to block 7") !=
        std::string::npos);
  copy.copies = {{4, 4, false}};
  CHECK_FALSE(error_of(copy, batch, seq, vocab).empty());
  StepInput window = make_step({{1, 2}}, {9}, {1});
  window.window_tables[0][0] = -1; // positions 0..3: no query at 9 or 10 sees them
  window.window_tables[0][1] = -1; // 4..7: the query at 9 sees 5..9
  CHECK(error_of(window, batch, seq, vocab)
            .find("positions 4..7 need sliding-window block 1, which is missing") !=
        std::string::npos);
  window.window_tables[0][1] = 4;
  CHECK(error_of(window, batch, seq, vocab).empty());
  CHECK(error_of(make_step({{100}}, {0}, {0}), batch, seq, vocab)
            .find("token id 100 is outside the vocabulary [0, 100)") != std::string::npos);
}

TEST_CASE("ParamLayout: per-token inputs, per-sequence ones, then the block tables") {
  const ParamLayout l(10, 3, 7, true);
  namespace p = xserv::models::params;
  CHECK(l.total == 3 * 10 + 2 * 3 + 2 * 3 * 7);
  CHECK(l.table_blocks == 7);
  CHECK(l.offset.at(p::kTokenIds) == 0);
  CHECK(l.offset.at(p::kPositions) == 10);
  CHECK(l.offset.at(p::kTokenSeq) == 20);
  CHECK(l.offset.at(p::kCtxLens) == 30);
  CHECK(l.offset.at(p::kLogitRows) == 33);
  CHECK(l.offset.at(p::kBlockTable) == 36);
  CHECK(l.offset.at(p::kWindowTable) == 36 + 21);
  CHECK(l.offset.size() == 7);
  const ParamLayout no_window(10, 3, 7, false);
  CHECK(no_window.offset.count(p::kWindowTable) == 0);
  CHECK(no_window.total == 36 + 21);
}

TEST_CASE("row tables: a row's blocks, and the window's ring of blocks") {
  std::vector<int32_t> full, window;
  xserv::models::row_tables(kKv, 1, full, window);
  CHECK(full == std::vector<int32_t>{5, 6, 7, 8});
  CHECK(kKv.ring_blocks() == 3);                     // a window of 5 over blocks of 4
  CHECK(window == std::vector<int32_t>{4, 5, 6, 4}); // block 4 comes back after the ring
  CHECK(kKv.rows() == 2);
  CHECK_THROWS_WITH_AS(xserv::models::row_tables(kKv, 2, full, window),
                       doctest::Contains("KV row 2 is outside the 2 rows of 16 positions"),
                       xserv::Error);
  CHECK(kKv.rows(2) == 2); // rows of 2 blocks: 4 would fit, the window pool holds 2 rings
  xserv::models::row_tables(kKv, 1, full, window, 2);
  CHECK(full == std::vector<int32_t>{3, 4});
  CHECK(window == std::vector<int32_t>{4, 5});
  // Block 0 is the null block: no row has it.
  xserv::models::row_tables(kKv, 0, full, window);
  CHECK(full.front() == 1);
  CHECK(window.front() == 1);
}
