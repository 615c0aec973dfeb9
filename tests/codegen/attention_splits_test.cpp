// The runtime's attention splits (runtime/plan.h) against codegen's and the launch rules they
// serve: a step's key splits, and the canonical order's chunk splits.
#include <doctest/doctest.h>

#include <algorithm>

#include "codegen/emit.h"
#include "runtime/plan.h"

using namespace xserv;

TEST_CASE("the runtime's attention split rule is codegen's") {
  for (int keys = 0; keys <= 5000; ++keys)
    REQUIRE(runtime::attention_splits(keys) == codegen::attention_splits(keys));
  CHECK(runtime::attention_key_bucket(1) == 64);
  CHECK(runtime::attention_key_bucket(65) == 128);
  CHECK(runtime::attention_key_bucket(5001) == 2048);
  // A step's splits: the keys' count, cut so that tokens x kv heads x splits stays within
  // kAttnSplitBlocks (256), never below 1; heads 0 keeps the keys' count; a window caps keys.
  using runtime::attention_step_splits;
  CHECK(attention_step_splits(1024, 0, 1, 8) == 16); // one sequence: the keys decide
  CHECK(attention_step_splits(2048, 0, 1, 8) == 32);
  CHECK(attention_step_splits(2048, 0, 8, 8) == 4); // 8 x 8 x 4 = 256 blocks
  CHECK(attention_step_splits(2048, 0, 16, 8) == 2);
  CHECK(attention_step_splits(1024, 0, 64, 8) == 1);            // 512 blocks already
  CHECK(attention_step_splits(2048, 128, 1, 8) == 2);           // the window's 128 keys
  CHECK(attention_step_splits(2048, 0, 64, 0) == 32);           // no heads: the keys alone
  CHECK(attention_step_splits(2048, 0, 1 << 30, 1 << 16) == 1); // no overflow
  for (int tokens = 1; tokens <= 64; ++tokens)
    for (int bucket = 64; bucket <= 2048; bucket *= 2) {
      const int s = attention_step_splits(bucket, 0, tokens, 8);
      REQUIRE(s >= 1);
      REQUIRE(s <= runtime::attention_splits(bucket));
      REQUIRE((s == 1 || tokens * 8 * s <= runtime::kAttnSplitBlocks));
    }
  // The canonical order's splits: every chunk a token's keys can span (a block each) while
  // tokens x kv heads stays under kAttnSplitBlocks and the states fit kAttnChunkPartials, else
  // 1 (every chunk in the token's block).
  using runtime::attention_chunk_splits;
  CHECK(attention_chunk_splits(4096, 0, 1, 8, 128) == 32);     // all 32 chunks below 4096
  CHECK(attention_chunk_splits(128, 0, 1, 8, 128) == 1);       // one chunk: no combine
  CHECK(attention_chunk_splits(4096, 128, 1, 8, 128) == 2);    // a window crosses 2 at most
  CHECK(attention_chunk_splits(4096, 8, 1, 2, 128) == 2);      // even a window of 8
  CHECK(attention_chunk_splits(4096, 0, 32, 8, 128) == 1);     // 256 blocks without splits
  CHECK(attention_chunk_splits(4096, 0, 31, 8, 128) == 32);    // 31 x 32 states fit 2048
  CHECK(attention_chunk_splits(131072, 0, 2, 8, 128) == 1024); // 2 x 1024 fit
  CHECK(attention_chunk_splits(131072, 0, 3, 8, 128) == 1);    // 3 x 1024 do not
  for (int tokens = 1; tokens <= 64; ++tokens)
    for (int bucket = 64; bucket <= 8192; bucket *= 2)
      for (int window : {0, 8, 128}) {
        const int s = attention_chunk_splits(bucket, window, tokens, 8, 128);
        // Enough blocks for every chunk any token's keys span (position < bucket), or one.
        for (int p = 0; p < bucket; p += 61) {
          const int lo = window > 0 ? std::max(0, p - window + 1) : 0;
          REQUIRE((s == 1 || p / 128 - lo / 128 + 1 <= s));
        }
        REQUIRE((s == 1 || tokens * s <= runtime::kAttnChunkPartials));
      }
}
