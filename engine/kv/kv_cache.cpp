// KvCache: blocks of both pools per sequence, the prefix cache's lookups and commits, forks.
#include "engine/kv/kv_cache.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/error.h"

namespace xserv::engine::kv {

namespace {

/// A window pool for a model without sliding layers: never used, the smallest BlockPool.
int64_t window_pool_blocks(const models::KvGeometry& g) {
  return g.window > 0 ? g.window_blocks : 2;
}

} // namespace

KvCache::KvCache(const models::KvGeometry& g, bool prefix_caching)
    : g_(g), full_(std::max<int64_t>(g.blocks, 2), prefix_caching),
      window_(std::max<int64_t>(window_pool_blocks(g), 2), prefix_caching) {
  if (g.block_size < 1 || g.table_blocks < 1)
    throw Error(fmt::format("a KV geometry of blocks of {} positions, tables of {} blocks",
                            g.block_size, g.table_blocks));
  // The oldest running sequence must always be able to go on alone (the scheduler preempts
  // only younger ones): a whole sequence in the full pool, one step's window blocks (those its
  // first query reads and those the step writes) in the window pool. Block 0 is the null block.
  if (g.blocks - 1 < g.table_blocks)
    throw Error(fmt::format("a KV pool of {} blocks of {} positions cannot hold one sequence of "
                            "the plan's {} positions ({} blocks and the null block)",
                            g.blocks, g.block_size, g.table_blocks * g.block_size, g.table_blocks));
  if (g.window > 0 && g.window_blocks - 1 < 2 * g.ring_blocks())
    throw Error(fmt::format("a sliding-window KV pool of {} blocks cannot hold one step's window "
                            "({} blocks and the null block)",
                            g.window_blocks, 2 * g.ring_blocks()));
}

void KvCache::window_writes(int64_t ctx, int64_t n, int64_t& lo, int64_t& hi) const {
  const int64_t first = std::max(ctx, ctx + n - g_.window);
  lo = first / g_.block_size;
  hi = (ctx + n - 1) / g_.block_size + 1;
}

void KvCache::needs(const SeqBlocks& s, int64_t ctx, int64_t n, int64_t& full,
                    int64_t& window) const {
  full = std::max<int64_t>(0, g_.blocks_for(ctx + n) - int64_t(s.full.size()));
  window = 0;
  if (g_.window == 0 || n <= 0)
    return;
  int64_t lo = 0, hi = 0;
  window_writes(ctx, n, lo, hi);
  for (int64_t j = lo; j < hi; ++j)
    window += j >= int64_t(s.window.size()) || s.window[size_t(j)] == kNullBlock ? 1 : 0;
}

int64_t KvCache::match_prefix(SeqBlocks& s, std::span<const int32_t> tokens) {
  XSERV_CHECK(s.empty(), "match_prefix for a sequence that holds blocks");
  queries_ += int64_t(tokens.size());
  if (!full_.caching() || tokens.size() < 2)
    return 0;
  const int64_t bs = g_.block_size;
  const int64_t most = int64_t(tokens.size() - 1) / bs; // one token is left to compute
  std::vector<int32_t> blocks;
  std::vector<BlockHash> hashes;
  BlockHash parent = kRootHash;
  for (int64_t j = 0; j < most; ++j) {
    const BlockHash h = hash_block(parent, tokens.subspan(size_t(j * bs), size_t(bs)));
    const int32_t b = full_.lookup(h);
    if (b < 0)
      break;
    blocks.push_back(b);
    hashes.push_back(h);
    parent = h;
  }
  auto k = int64_t(blocks.size());
  // The window pool must hold what a query at position k * bs reads: positions from
  // k * bs - window + 1 on.
  int64_t lo = 0;
  std::vector<int32_t> wblocks;
  while (g_.window > 0 && k > 0) {
    lo = std::max<int64_t>(0, k * bs - g_.window + 1) / bs;
    wblocks.clear();
    for (int64_t j = lo; j < k; ++j) {
      const int32_t b = window_.lookup(hashes[size_t(j)]);
      if (b < 0)
        break;
      wblocks.push_back(b);
    }
    if (int64_t(wblocks.size()) == k - lo)
      break;
    --k;
  }
  if (k == 0)
    return 0;
  s.full.assign(blocks.begin(), blocks.begin() + k);
  s.hashes.assign(hashes.begin(), hashes.begin() + k);
  for (int32_t b : s.full)
    full_.retain(b);
  if (g_.window > 0) {
    s.window.assign(size_t(k), kNullBlock);
    for (int64_t j = lo; j < k; ++j) {
      s.window[size_t(j)] = wblocks[size_t(j - lo)];
      window_.retain(s.window[size_t(j)]);
    }
  }
  hits_ += k * bs;
  return k * bs;
}

int64_t KvCache::fit(const SeqBlocks& s, int64_t ctx, int64_t n, int64_t reserve) const {
  const int64_t avail = full_.free_blocks() - reserve;
  if (avail < 0 || n <= 0)
    return 0;
  n = std::min(n, (int64_t(s.full.size()) + avail) * g_.block_size - ctx);
  if (n <= 0 || g_.window == 0)
    return std::max<int64_t>(n, 0);
  for (;;) {
    int64_t f = 0, w = 0;
    needs(s, ctx, n, f, w);
    if (w <= window_.free_blocks())
      return n;
    if (n == 1)
      return 0;
    // Fewer tokens write fewer window blocks, down to those of one token.
    n = n > g_.block_size ? n - g_.block_size : 1;
  }
}

bool KvCache::allocate(SeqBlocks& s, int64_t ctx, int64_t n) {
  int64_t need_full = 0, need_window = 0;
  needs(s, ctx, n, need_full, need_window);
  if (need_full > full_.free_blocks() || need_window > window_.free_blocks())
    return false;
  const int64_t end = g_.blocks_for(ctx + n);
  while (int64_t(s.full.size()) < end)
    s.full.push_back(full_.allocate());
  if (g_.window == 0)
    return true;
  if (int64_t(s.window.size()) < end)
    s.window.resize(size_t(end), kNullBlock);
  int64_t lo = 0, hi = 0;
  window_writes(ctx, n, lo, hi);
  // With prefix caching, the chunk's earlier window blocks too, while a quarter of the pool
  // stays free: they enter the prefix cache at commit and go back to the free queue at once.
  const int64_t first = ctx / g_.block_size;
  if (full_.caching() && lo > first &&
      window_.free_blocks() - need_window - (lo - first) >= window_.capacity() / 4)
    lo = first;
  for (int64_t j = lo; j < hi; ++j)
    if (s.window[size_t(j)] == kNullBlock)
      s.window[size_t(j)] = window_.allocate();
  return true;
}

void KvCache::commit(SeqBlocks& s, std::span<const int32_t> tokens, int64_t ctx, int64_t n) {
  const int64_t end = ctx + n, bs = g_.block_size;
  XSERV_CHECK(int64_t(tokens.size()) >= end && int64_t(s.full.size()) >= g_.blocks_for(end),
              "commit of positions the sequence has no tokens or blocks for");
  if (full_.caching())
    for (auto j = int64_t(s.hashes.size()); (j + 1) * bs <= end; ++j) {
      const BlockHash parent = j == 0 ? kRootHash : s.hashes[size_t(j - 1)];
      s.hashes.push_back(hash_block(parent, tokens.subspan(size_t(j * bs), size_t(bs))));
      full_.cache(s.full[size_t(j)], s.hashes.back());
    }
  if (g_.window == 0)
    return;
  // The window blocks this step filled (a block the sequence holds is written at all its
  // positions below its length).
  if (full_.caching())
    for (int64_t j = ctx / bs; (j + 1) * bs <= end; ++j)
      if (s.window[size_t(j)] != kNullBlock)
        window_.cache(s.window[size_t(j)], s.hashes[size_t(j)]);
  // The next query, at position `end`, reads from end - window + 1 on.
  const int64_t keep = std::max<int64_t>(0, end - g_.window + 1) / bs;
  for (int64_t j = 0; j < keep && j < int64_t(s.window.size()); ++j)
    if (s.window[size_t(j)] != kNullBlock) {
      window_.release(s.window[size_t(j)]);
      s.window[size_t(j)] = kNullBlock;
    }
}

void KvCache::release(SeqBlocks& s) {
  for (size_t j = s.full.size(); j-- > 0;)
    full_.release(s.full[j]);
  for (size_t j = s.window.size(); j-- > 0;)
    if (s.window[j] != kNullBlock)
      window_.release(s.window[j]);
  s = SeqBlocks{};
}

bool KvCache::fork(const SeqBlocks& parent, int64_t positions, SeqBlocks& child,
                   std::vector<models::StepInput::BlockCopy>& copies) {
  XSERV_CHECK(child.empty(), "fork into a sequence that holds blocks");
  const int64_t nblocks = g_.blocks_for(positions);
  XSERV_CHECK(int64_t(parent.full.size()) >= nblocks, "fork of positions the parent lacks");
  const bool partial = positions % g_.block_size != 0;
  const size_t last = size_t(nblocks - 1);
  const bool window_partial =
      g_.window > 0 && partial && last < parent.window.size() && parent.window[last] != kNullBlock;
  if ((partial && full_.free_blocks() < 1) || (window_partial && window_.free_blocks() < 1))
    return false;
  child.full.assign(parent.full.begin(), parent.full.begin() + nblocks);
  for (size_t j = 0; j < child.full.size(); ++j)
    if (partial && j == last) {
      child.full[j] = full_.allocate();
      copies.push_back({parent.full[j], child.full[j], false});
    } else {
      full_.retain(child.full[j]);
    }
  if (g_.window > 0) {
    child.window.assign(size_t(nblocks), kNullBlock);
    for (size_t j = 0; j < child.window.size() && j < parent.window.size(); ++j) {
      if (parent.window[j] == kNullBlock)
        continue;
      if (window_partial && j == last) {
        child.window[j] = window_.allocate();
        copies.push_back({parent.window[j], child.window[j], true});
      } else {
        child.window[j] = parent.window[j];
        window_.retain(child.window[j]);
      }
    }
  }
  child.hashes = parent.hashes;
  return true;
}

void KvCache::tables(const SeqBlocks& s, int64_t end, std::vector<int32_t>& full,
                     std::vector<int32_t>& window) const {
  const auto n = size_t(g_.blocks_for(end));
  XSERV_CHECK(s.full.size() >= n, "block tables past the sequence's blocks");
  full.assign(s.full.begin(), s.full.begin() + std::ptrdiff_t(n));
  window.clear();
  if (g_.window > 0) {
    window.assign(n, kNullBlock);
    std::copy_n(s.window.begin(), std::min(n, s.window.size()), window.begin());
  }
}

void KvCache::clear() {
  full_.clear();
  window_.clear();
}

KvStats KvCache::stats() const {
  KvStats st;
  st.blocks = full_.capacity();
  st.blocks_used = full_.in_use();
  if (g_.window > 0) {
    st.window_blocks = window_.capacity();
    st.window_blocks_used = window_.in_use();
  }
  st.cached_free = full_.cached_free_blocks();
  st.prefix_queries = queries_;
  st.prefix_hits = hits_;
  st.prefix_evictions = full_.evictions() + window_.evictions();
  return st;
}

std::string pool_summary(const models::KvGeometry& g, uint64_t full_block_bytes,
                         uint64_t window_block_bytes) {
  const double gib = double(1ull << 30);
  const int64_t usable = std::max<int64_t>(g.blocks - 1, 0); // the null block aside
  std::string s = fmt::format(
      "KV pool: {} blocks of {} positions ({} tokens, {} sequences of the plan's {}), {:.1f} KiB "
      "a position, {:.2f} GiB",
      usable, g.block_size, usable * g.block_size, usable / std::max<int64_t>(g.table_blocks, 1),
      g.table_blocks * g.block_size, double(full_block_bytes) / double(g.block_size) / 1024.0,
      double(full_block_bytes) * double(g.blocks) / gib);
  if (g.window > 0)
    s += fmt::format("; sliding-window pool (window {}): {} blocks, {:.1f} KiB a position, "
                     "{:.2f} GiB",
                     g.window, std::max<int64_t>(g.window_blocks - 1, 0),
                     double(window_block_bytes) / double(g.block_size) / 1024.0,
                     double(window_block_bytes) * double(g.window_blocks) / gib);
  return s;
}

} // namespace xserv::engine::kv
