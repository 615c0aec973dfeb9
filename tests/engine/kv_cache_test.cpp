// The engine's KV block pool and cache manager on their own: reference counts, the free queue's
// eviction order, prefix hits through the hash chain (and the window pool's part in them), copy
// on write for forks, exhaustion that changes nothing, and the sliding-window blocks a sequence
// gives back.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "base/error.h"
#include "engine/kv/kv_cache.h"

using namespace xserv;
using engine::kv::BlockPool;
using engine::kv::kNullBlock;
using engine::kv::KvCache;
using engine::kv::SeqBlocks;

namespace {

engine::kv::BlockHash h(int x) {
  const std::vector<int32_t> t = {x};
  return engine::kv::hash_block(engine::kv::kRootHash, t);
}

std::vector<int32_t> seq_tokens(int n, int32_t first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

/// Geometry: blocks of 4 positions, tables of 16 (64 positions), `blocks` full blocks, a window
/// of `window` with `wblocks` window blocks.
models::KvGeometry geometry(int64_t blocks, int64_t window = 0, int64_t wblocks = 0) {
  models::KvGeometry g;
  g.block_size = 4;
  g.table_blocks = 16;
  g.window = window;
  g.blocks = blocks;
  g.window_blocks = wblocks;
  return g;
}

} // namespace

TEST_CASE("kv block pool: reference counts, the null block, exhaustion") {
  BlockPool p(5, true);
  CHECK(p.capacity() == 4);
  CHECK(p.free_blocks() == 4);
  std::set<int32_t> got;
  for (int i = 0; i < 4; ++i)
    got.insert(p.allocate());
  CHECK(got == std::set<int32_t>{1, 2, 3, 4}); // never the null block
  CHECK(p.allocate() == -1);
  CHECK(p.free_blocks() == 0);
  p.retain(2);
  CHECK(p.refs(2) == 2);
  p.release(2);
  CHECK(p.free_blocks() == 0); // still held once
  p.release(2);
  CHECK(p.free_blocks() == 1);
  CHECK(p.allocate() == 2);
  CHECK(p.refs(kNullBlock) == 1); // held for good
}

TEST_CASE("kv block pool: plain blocks go first, cached ones least recently freed first") {
  BlockPool p(6, true); // blocks 1..5
  std::vector<int32_t> b;
  for (int i = 0; i < 5; ++i)
    b.push_back(p.allocate());
  p.cache(b[0], h(10));
  p.cache(b[1], h(11));
  p.cache(b[2], h(12));
  // Freed in the order 1, 0, 2 (cached), then 3 and 4 (plain).
  p.release(b[1]);
  p.release(b[0]);
  p.release(b[2]);
  p.release(b[3]);
  p.release(b[4]);
  CHECK(p.free_blocks() == 5);
  CHECK(p.cached_free_blocks() == 3);
  CHECK(p.lookup(h(11)) == b[1]); // still cached while free
  // Plain blocks first (the most recently freed in front), then the cached in freeing order.
  CHECK(p.allocate() == b[4]);
  CHECK(p.allocate() == b[3]);
  CHECK(p.evictions() == 0);
  CHECK(p.allocate() == b[1]); // evicts 11
  CHECK(p.evictions() == 1);
  CHECK(p.lookup(h(11)) == -1);
  // A hit takes a free cached block out of the queue: it is not handed out while held.
  p.retain(b[2]);
  CHECK(p.allocate() == b[0]);
  CHECK(p.allocate() == -1);
  CHECK(p.lookup(h(12)) == b[2]);
  CHECK(p.lookup(h(10)) == -1);
  // A second block with the same content: the cache keeps the first.
  p.cache(b[3], h(12));
  CHECK(p.lookup(h(12)) == b[2]);
  // Without caching nothing is ever found.
  BlockPool off(3, false);
  const int32_t x = off.allocate();
  off.cache(x, h(1));
  CHECK(off.lookup(h(1)) == -1);
}

TEST_CASE("kv block hashes: a chain over token ids, equal only for equal prefixes") {
  const std::vector<int32_t> a = {1, 2, 3, 4}, b = {1, 2, 3, 5};
  const auto ha = engine::kv::hash_block(engine::kv::kRootHash, a);
  CHECK(ha == engine::kv::hash_block(engine::kv::kRootHash, a));
  CHECK_FALSE(ha == engine::kv::hash_block(engine::kv::kRootHash, b));
  // The same block after another parent is another block.
  CHECK_FALSE(engine::kv::hash_block(ha, a) == engine::kv::hash_block(h(0), a));
  // Lengths are part of it: (1,2,3) then (4) is not (1,2,3,4).
  const std::vector<int32_t> c = {1, 2, 3}, d = {4};
  CHECK_FALSE(engine::kv::hash_block(engine::kv::hash_block(engine::kv::kRootHash, c), d) ==
              engine::kv::hash_block(engine::kv::kRootHash, a));
}

TEST_CASE("kv cache: a prefix hit takes the cached blocks, leaving one token to compute") {
  KvCache kv(geometry(40), true);
  const std::vector<int32_t> t = seq_tokens(18, 100); // 4 full blocks and 2 positions
  SeqBlocks a;
  CHECK(kv.match_prefix(a, t) == 0);
  REQUIRE(kv.allocate(a, 0, 18));
  CHECK(a.full.size() == 5);
  kv.commit(a, t, 0, 18);
  CHECK(a.hashes.size() == 4); // full blocks only
  // A second sequence with the same 18 tokens: 16 positions hit; one of the same 16 tokens only
  // hits 12 (its 16th token must be computed for its logits).
  SeqBlocks b;
  CHECK(kv.match_prefix(b, t) == 16);
  CHECK(std::equal(b.full.begin(), b.full.end(), a.full.begin()));
  SeqBlocks c;
  CHECK(kv.match_prefix(c, std::span(t).first(16)) == 12);
  // Another token in block 2: blocks 0 and 1 hit.
  std::vector<int32_t> u = t;
  u[9] = 7;
  SeqBlocks d;
  CHECK(kv.match_prefix(d, u) == 8);
  const engine::kv::KvStats st = kv.stats();
  CHECK(st.prefix_queries == 18 + 18 + 16 + 18);
  CHECK(st.prefix_hits == 16 + 12 + 8);
  // The shared blocks are held three times over; release gives each reference back.
  kv.release(a);
  kv.release(b);
  kv.release(c);
  kv.release(d);
  CHECK(kv.stats().blocks_used == 0);
  CHECK(kv.stats().cached_free == 4);
  // Off: nothing is found.
  KvCache off(geometry(40), false);
  SeqBlocks e;
  REQUIRE(off.allocate(e, 0, 18));
  off.commit(e, t, 0, 18);
  SeqBlocks f;
  CHECK(off.match_prefix(f, t) == 0);
}

TEST_CASE("kv cache: exhaustion refuses and changes nothing, and fit says what does fit") {
  KvCache kv(geometry(18), true); // 17 blocks: one sequence of 64 positions and one block more
  SeqBlocks a, b;
  REQUIRE(kv.allocate(a, 0, 60)); // 15 blocks
  CHECK(kv.fit(b, 0, 20) == 8);   // 2 blocks left
  CHECK(kv.fit(b, 0, 20, 1) == 4);
  const SeqBlocks before = b;
  CHECK_FALSE(kv.allocate(b, 0, 20));
  CHECK(b.full == before.full);
  CHECK(kv.stats().blocks_used == 15);
  REQUIRE(kv.allocate(b, 0, 8));
  CHECK(kv.fit(a, 60, 4) == 0);
  kv.release(b);
  CHECK(kv.fit(a, 60, 4) == 4);
  // A pool that cannot hold one sequence of the plan's length is refused at once.
  CHECK_THROWS_WITH_AS(KvCache(geometry(16), true),
                       doctest::Contains("cannot hold one sequence of the plan's 64 positions"),
                       Error);
}

TEST_CASE("kv cache: a fork shares full blocks and copies the partly filled last one") {
  KvCache kv(geometry(40, 8, 20), true);
  const std::vector<int32_t> t = seq_tokens(10, 5);
  SeqBlocks p;
  REQUIRE(kv.allocate(p, 0, 10));
  kv.commit(p, t, 0, 10);
  std::vector<models::StepInput::BlockCopy> copies;
  SeqBlocks c;
  REQUIRE(kv.fork(p, 10, c, copies));
  REQUIRE(c.full.size() == 3);
  CHECK(c.full[0] == p.full[0]);
  CHECK(c.full[1] == p.full[1]);
  CHECK(c.full[2] != p.full[2]); // positions 8, 9: its own copy
  // The window pool holds blocks 0..2 (a query at 10 reads from position 3, in block 0): the
  // whole ones shared, the partly filled block 2 copied too.
  REQUIRE(copies.size() == 2);
  CHECK(copies[0] == models::StepInput::BlockCopy{p.full[2], c.full[2], false});
  CHECK(copies[1] == models::StepInput::BlockCopy{p.window[2], c.window[2], true});
  CHECK(c.window[1] == p.window[1]);
  // Whole blocks: nothing to copy.
  SeqBlocks q, r;
  const std::vector<int32_t> t8 = seq_tokens(8, 50);
  REQUIRE(kv.allocate(q, 0, 8));
  kv.commit(q, t8, 0, 8);
  copies.clear();
  REQUIRE(kv.fork(q, 8, r, copies));
  CHECK(copies.empty());
  CHECK(r.full == q.full);
  kv.release(p);
  kv.release(c);
  kv.release(q);
  kv.release(r);
  CHECK(kv.stats().blocks_used == 0);
  CHECK(kv.stats().window_blocks_used == 0);
}

TEST_CASE("kv cache: a sliding window's blocks go back once no query reads them") {
  KvCache kv(geometry(40, 8, 30), true); // a window of 8: ring of 3 blocks
  const std::vector<int32_t> t = seq_tokens(40, 1);
  SeqBlocks s;
  // A prompt of 30 in one chunk: with caching on and room in the pool, window blocks for all
  // of it (so every block can serve a later prefix hit).
  REQUIRE(kv.allocate(s, 0, 30));
  CHECK(std::count(s.window.begin(), s.window.end(), kNullBlock) == 0);
  kv.commit(s, t, 0, 30);
  // The next query, at 30, reads 23..29: blocks 5..7; the others went back.
  for (size_t j = 0; j < s.window.size(); ++j)
    CHECK((s.window[j] != kNullBlock) == (j >= 5));
  // Decode on: each step gives back what falls out of the window.
  for (int p = 30; p < 40; ++p) {
    REQUIRE(kv.allocate(s, p, 1));
    kv.commit(s, t, p, 1);
    const int64_t held =
        std::count_if(s.window.begin(), s.window.end(), [](int32_t b) { return b != kNullBlock; });
    CHECK(held <= 3);
  }
  // Without caching a long chunk takes window blocks for its last 8 positions only; the rest
  // of its table is the null block.
  KvCache off(geometry(40, 8, 30), false);
  SeqBlocks o;
  REQUIRE(off.allocate(o, 0, 30));
  for (size_t j = 0; j < o.window.size(); ++j)
    CHECK((o.window[j] != kNullBlock) == (j >= 5)); // positions 22..29 in blocks 5..7
  std::vector<int32_t> full, window;
  off.tables(o, 30, full, window);
  CHECK(full.size() == 8);
  CHECK(window == o.window);
}

TEST_CASE("kv cache: a prefix hit needs the window blocks its first query reads") {
  KvCache kv(geometry(60, 8, 40), true);
  const std::vector<int32_t> shared = seq_tokens(32, 9);
  std::vector<int32_t> a = shared, b = shared;
  a.insert(a.end(), {1, 2, 3});
  b.insert(b.end(), {4, 5, 6});
  SeqBlocks sa;
  REQUIRE(kv.allocate(sa, 0, int64_t(a.size())));
  kv.commit(sa, a, 0, int64_t(a.size()));
  kv.release(sa);
  // b shares 32 positions (8 blocks): the full pool has them, and the window pool the blocks
  // a query at 32 reads (25..31), so all 8 hit.
  SeqBlocks sb;
  CHECK(kv.match_prefix(sb, b) == 32);
  CHECK(sb.window[6] != kNullBlock);
  CHECK(sb.window[7] != kNullBlock);
  CHECK(sb.window[5] == kNullBlock);
  kv.release(sb);
  // A longer sequence whose window blocks near position 32 were never kept (a window pool with
  // no room beyond one step's blocks takes blocks for a chunk's last 8 positions only): the
  // full pool has all 8 blocks, but no query at a block edge finds its window, so no hit.
  KvCache small(geometry(60, 8, 7), true);
  std::vector<int32_t> c = shared;
  for (int i = 0; i < 20; ++i)
    c.push_back(200 + i);
  SeqBlocks s1;
  REQUIRE(small.allocate(s1, 0, int64_t(c.size())));
  small.commit(s1, c, 0, int64_t(c.size()));
  small.release(s1);
  SeqBlocks s2;
  CHECK(small.match_prefix(s2, b) == 0);
  CHECK(s2.empty());
  // The same sequence on the roomy pool: its window blocks were all kept, and the hit is whole.
  SeqBlocks s3, s4;
  REQUIRE(kv.allocate(s3, 0, int64_t(c.size())));
  kv.commit(s3, c, 0, int64_t(c.size()));
  kv.release(s3);
  CHECK(kv.match_prefix(s4, b) == 32);
  for (int64_t p = 32 - 7; p < 32; ++p)
    CHECK(s4.window[size_t(p / 4)] != kNullBlock);
}
