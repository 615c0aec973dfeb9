// The engine's KV cache: the blocks of the model's two pools (full-attention layers, sliding-window
// layers) handed to sequences, and the prefix cache over them. The scheduler asks it how many of
// a sequence's new tokens fit, takes blocks for a step, commits what the step wrote (full blocks
// enter the prefix cache; window blocks no query reads again go back), forks a sequence for n > 1
// and builds the block tables of a step.
//
// A sliding layer reads at most `window` positions back, so a sequence holds only the window
// blocks its next queries read and its step writes. A prompt chunk longer than the window needs
// window blocks only for its last `window` positions (the others' table entries are the null
// block, where kv_write's stores go unread); with prefix caching on it takes blocks for all of
// them while the pool has room, so that every block of a prompt can serve a later prefix hit.
// Every window block a sequence holds is written at all its positions below the sequence's
// length. Prefix caching covers both pools: a prefix of k blocks is usable when the full pool
// holds all k and the window pool the ones a query at position k * block_size reads.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/kv/block_pool.h"
#include "models/step.h"

namespace xserv::engine::kv {

/// A sequence's blocks.
struct SeqBlocks {
  std::vector<int32_t> full;   ///< the full pool's block of each of its positions' blocks
  std::vector<int32_t> window; ///< the window pool's, kNullBlock where it holds none
  /// The hash of each full block of the sequence's tokens, as far as they are committed.
  std::vector<BlockHash> hashes;
  bool empty() const { return full.empty(); }
};

/// Counters of a KvCache.
struct KvStats {
  int64_t blocks = 0, blocks_used = 0;               ///< the full pool (null block left out)
  int64_t window_blocks = 0, window_blocks_used = 0; ///< the sliding-window pool
  int64_t cached_free = 0;      ///< free full blocks that still hold a cached prefix block
  int64_t prefix_queries = 0;   ///< tokens of the sequences that looked up a prefix
  int64_t prefix_hits = 0;      ///< of them, tokens found cached
  int64_t prefix_evictions = 0; ///< cached blocks (both pools) handed out for other content
};

class KvCache {
public:
  /// Pools of g.blocks and g.window_blocks blocks; `prefix_caching` on or off. Throws
  /// xserv::Error when the pools cannot hold one sequence of g.table_blocks blocks (and, with a
  /// window, the window blocks one step of it needs).
  KvCache(const models::KvGeometry& g, bool prefix_caching);

  const models::KvGeometry& geometry() const { return g_; }
  bool prefix_caching() const { return full_.caching(); }

  /// The longest cached prefix of `tokens` for a sequence that holds no blocks yet: whole blocks,
  /// leaving at least one token to compute (its logits). Its blocks are taken into `s` and its
  /// length in positions returned (0: no hit, or prefix caching off).
  int64_t match_prefix(SeqBlocks& s, std::span<const int32_t> tokens);
  /// The most of `n` new tokens at positions ctx.. of `s` whose blocks the pools can give now,
  /// leaving `reserve` full blocks free.
  int64_t fit(const SeqBlocks& s, int64_t ctx, int64_t n, int64_t reserve = 0) const;
  /// Takes the blocks that positions [ctx, ctx + n) of `s` need: false, changing nothing, when
  /// the pools lack them.
  bool allocate(SeqBlocks& s, int64_t ctx, int64_t n);
  /// After a step wrote positions [ctx, ctx + n) of `s` (`tokens`: the sequence's ids from
  /// position 0, at least ctx + n of them): its full blocks enter the prefix cache (in both
  /// pools) and the window blocks no later query reads go back.
  void commit(SeqBlocks& s, std::span<const int32_t> tokens, int64_t ctx, int64_t n);
  /// Gives back every block of `s`, its last blocks first (so that a prefix's tail is evicted
  /// before its head); `s` is empty after.
  void release(SeqBlocks& s);
  /// `child` (empty) shares the blocks of `parent`, which holds `positions` positions; a partly
  /// filled last block is copied to a block of the child's own (appended to `copies`, to be made
  /// before the next step). False, changing nothing, when the pools lack those blocks.
  bool fork(const SeqBlocks& parent, int64_t positions, SeqBlocks& child,
            std::vector<models::StepInput::BlockCopy>& copies);
  /// The block tables of a step of `s` that ends at position `end` (exclusive).
  void tables(const SeqBlocks& s, int64_t end, std::vector<int32_t>& full,
              std::vector<int32_t>& window) const;

  /// Every block free, the prefix cache empty (the model's pools were cleared).
  void clear();
  KvStats stats() const;

private:
  /// Window block indices [lo, hi) that a step of n tokens at ctx must write.
  void window_writes(int64_t ctx, int64_t n, int64_t& lo, int64_t& hi) const;
  /// New blocks of each pool that positions [ctx, ctx + n) of `s` need.
  void needs(const SeqBlocks& s, int64_t ctx, int64_t n, int64_t& full, int64_t& window) const;

  models::KvGeometry g_;
  BlockPool full_, window_;
  int64_t queries_ = 0, hits_ = 0;
};

/// One line on the pools: blocks, positions each, bytes a position, capacity in tokens, the
/// sliding-window pool beside (the startup log and `xserv inspect` say it).
std::string pool_summary(const models::KvGeometry& g, uint64_t full_block_bytes,
                         uint64_t window_block_bytes);

} // namespace xserv::engine::kv
