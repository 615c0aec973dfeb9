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
using xserv::testing::make_step;

namespace {

std::string error_of(const StepInput& in, int64_t batch, int64_t seq, int64_t vocab) {
  try {
    validate_step(in, batch, seq, vocab);
  } catch (const xserv::Error& e) {
    return e.what();
  }
  return "";
}

} // namespace

TEST_CASE("split_step: sub-steps of at most cap tokens, each sequence's pieces in order") {
  const StepInput in = make_step({{1, 2, 3, 4, 5}, {6}, {7, 8, 9}}, {0, 4, 10}, {0, 1, 2});
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
  CHECK(error_of(make_step({{1}}, {0}, {2}), batch, seq, vocab).find("cache row 2") !=
        std::string::npos);
  CHECK(error_of(make_step({{100}}, {0}, {0}), batch, seq, vocab)
            .find("token id 100 is outside the vocabulary [0, 100)") != std::string::npos);
}

TEST_CASE("ParamLayout: per-token inputs, then per-sequence ones, each once") {
  const ParamLayout l(10, 3);
  namespace p = xserv::models::params;
  CHECK(l.total == 3 * 10 + 3 * 3);
  CHECK(l.offset.at(p::kTokenIds) == 0);
  CHECK(l.offset.at(p::kPositions) == 10);
  CHECK(l.offset.at(p::kTokenSeq) == 20);
  CHECK(l.offset.at(p::kCtxLens) == 30);
  CHECK(l.offset.at(p::kCacheRows) == 33);
  CHECK(l.offset.at(p::kLogitRows) == 36);
  CHECK(l.offset.size() == 6);
}
