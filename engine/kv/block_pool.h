// One pool of KV-cache blocks as the engine hands them out: reference counts, a free queue in
// eviction order, and the prefix cache's map from a block's content hash to the block holding
// it (the shape of vLLM's v1 block pool; the hashes are SHA-256, so that no crafted prompt can
// make two prefixes collide).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace xserv::engine::kv {

/// What a full block holds: 128 bits of SHA-256 over its parent block's hash and its own token
/// ids, so that equal hashes mean equal token prefixes, position 0 to the block's end.
struct BlockHash {
  std::array<uint64_t, 2> words{};
  bool operator==(const BlockHash&) const = default;
};

/// The hash of the block after `parent` (kRootHash for block 0) holding `tokens`.
BlockHash hash_block(const BlockHash& parent, std::span<const int32_t> tokens);
inline constexpr BlockHash kRootHash{};

struct BlockHashOf {
  size_t operator()(const BlockHash& h) const { return size_t(h.words[0] ^ (h.words[1] << 1)); }
};

/// The null block: every pool's block 0 is never handed out. Table entries a step neither reads
/// nor writes, and the padding sequences of a decode graph's batch, point at it.
inline constexpr int32_t kNullBlock = 0;

/// Blocks 1..blocks-1 of one pool. A block is in use while its reference count is above zero
/// (the sequences whose tables hold it); at zero it joins the free queue: at the front when it
/// holds nothing worth keeping, at the back when it holds a cached prefix block, so that
/// allocation takes plain blocks first and then the least recently freed cached one, evicting
/// its hash. A prefix-cache hit on a free block takes it out of the queue again.
class BlockPool {
public:
  /// A pool of `blocks` blocks (block 0 the null block); `caching`: blocks may be entered in the
  /// prefix cache.
  BlockPool(int64_t blocks, bool caching);

  /// Blocks that can be handed out (all but the null block).
  int64_t capacity() const { return int64_t(refs_.size()) - 1; }
  /// Blocks in the free queue (cached ones included: they are evicted on demand).
  int64_t free_blocks() const { return free_count_; }
  /// Free blocks that hold a cached prefix block.
  int64_t cached_free_blocks() const { return cached_free_; }
  int64_t in_use() const { return capacity() - free_count_; }
  bool caching() const { return caching_; }

  /// A block with reference count 1: the front of the free queue, its hash evicted if it had
  /// one. -1 when every block is in use.
  int32_t allocate();
  /// One more reference to block `b` (a prefix hit, a fork); a free block leaves the queue.
  void retain(int32_t b);
  /// One reference less; at zero the block joins the free queue.
  void release(int32_t b);
  int32_t refs(int32_t b) const { return refs_[size_t(b)]; }

  /// The block that holds `h` in the prefix cache, or -1. Changes nothing.
  int32_t lookup(const BlockHash& h) const;
  /// Enters block `b` (in use) into the prefix cache as holding `h`. A block already cached
  /// keeps its hash; when another block holds `h` already, the cache keeps that one.
  void cache(int32_t b, const BlockHash& h);
  bool cached(int32_t b) const { return has_hash_[size_t(b)]; }

  /// Cached blocks evicted (their hash forgotten) to be handed out again.
  int64_t evictions() const { return evictions_; }
  /// Every block free, the prefix cache empty (the model's pools were cleared).
  void clear();

private:
  void push_front(int32_t b);
  void push_back(int32_t b);
  void unlink(int32_t b);
  void forget(int32_t b);

  bool caching_;
  std::vector<int32_t> refs_;
  std::vector<int32_t> prev_, next_; ///< the free queue, doubly linked; -1 ends it
  std::vector<bool> in_queue_, has_hash_;
  std::vector<BlockHash> hash_;
  int32_t head_ = -1, tail_ = -1;
  int64_t free_count_ = 0, cached_free_ = 0, evictions_ = 0;
  std::unordered_map<BlockHash, int32_t, BlockHashOf> by_hash_;
};

} // namespace xserv::engine::kv
