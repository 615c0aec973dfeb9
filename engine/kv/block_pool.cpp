// BlockPool: the free queue as an intrusive doubly linked list over block ids, so that taking a
// cached block out of it on a prefix hit costs O(1).
#include "engine/kv/block_pool.h"

#include <cstring>

#include <fmt/format.h>

#include "base/error.h"
#include "runtime/sha256.h"

namespace xserv::engine::kv {

BlockHash hash_block(const BlockHash& parent, std::span<const int32_t> tokens) {
  runtime::Sha256 h;
  h.update(parent.words.data(), sizeof(parent.words));
  const auto n = static_cast<uint64_t>(tokens.size());
  h.update(&n, sizeof(n));
  h.update(tokens.data(), tokens.size_bytes());
  const std::array<uint8_t, 32> d = h.digest();
  BlockHash out;
  std::memcpy(out.words.data(), d.data(), sizeof(out.words));
  return out;
}

BlockPool::BlockPool(int64_t blocks, bool caching) : caching_(caching) {
  XSERV_CHECK(blocks >= 2 && blocks < (int64_t{1} << 31),
              fmt::format("a KV pool of {} blocks", blocks));
  const auto n = size_t(blocks);
  refs_.assign(n, 0);
  prev_.assign(n, -1);
  next_.assign(n, -1);
  in_queue_.assign(n, false);
  has_hash_.assign(n, false);
  hash_.assign(n, {});
  clear();
}

void BlockPool::clear() {
  head_ = tail_ = -1;
  free_count_ = cached_free_ = 0;
  by_hash_.clear();
  for (size_t b = 0; b < refs_.size(); ++b) {
    refs_[b] = 0;
    in_queue_[b] = false;
    has_hash_[b] = false;
  }
  refs_[kNullBlock] = 1; // never handed out, never freed
  for (int32_t b = 1; b < int32_t(refs_.size()); ++b)
    push_back(b);
}

void BlockPool::push_front(int32_t b) {
  prev_[size_t(b)] = -1;
  next_[size_t(b)] = head_;
  if (head_ >= 0)
    prev_[size_t(head_)] = b;
  head_ = b;
  if (tail_ < 0)
    tail_ = b;
  in_queue_[size_t(b)] = true;
  ++free_count_;
  cached_free_ += has_hash_[size_t(b)] ? 1 : 0;
}

void BlockPool::push_back(int32_t b) {
  next_[size_t(b)] = -1;
  prev_[size_t(b)] = tail_;
  if (tail_ >= 0)
    next_[size_t(tail_)] = b;
  tail_ = b;
  if (head_ < 0)
    head_ = b;
  in_queue_[size_t(b)] = true;
  ++free_count_;
  cached_free_ += has_hash_[size_t(b)] ? 1 : 0;
}

void BlockPool::unlink(int32_t b) {
  const int32_t p = prev_[size_t(b)], n = next_[size_t(b)];
  (p >= 0 ? next_[size_t(p)] : head_) = n;
  (n >= 0 ? prev_[size_t(n)] : tail_) = p;
  prev_[size_t(b)] = next_[size_t(b)] = -1;
  in_queue_[size_t(b)] = false;
  --free_count_;
  cached_free_ -= has_hash_[size_t(b)] ? 1 : 0;
}

void BlockPool::forget(int32_t b) {
  if (!has_hash_[size_t(b)])
    return;
  const auto it = by_hash_.find(hash_[size_t(b)]);
  if (it != by_hash_.end() && it->second == b)
    by_hash_.erase(it);
  has_hash_[size_t(b)] = false;
}

int32_t BlockPool::allocate() {
  if (head_ < 0)
    return -1;
  const int32_t b = head_;
  const bool had = has_hash_[size_t(b)];
  unlink(b);
  if (had) {
    forget(b);
    ++evictions_;
  }
  refs_[size_t(b)] = 1;
  return b;
}

void BlockPool::retain(int32_t b) {
  XSERV_CHECK(b > kNullBlock && b < int32_t(refs_.size()),
              fmt::format("KV block {} is not in the pool", b));
  if (in_queue_[size_t(b)])
    unlink(b);
  ++refs_[size_t(b)];
}

void BlockPool::release(int32_t b) {
  XSERV_CHECK(b > kNullBlock && b < int32_t(refs_.size()) && refs_[size_t(b)] > 0,
              fmt::format("KV block {} released while free", b));
  if (--refs_[size_t(b)] > 0)
    return;
  if (has_hash_[size_t(b)])
    push_back(b);
  else
    push_front(b);
}

int32_t BlockPool::lookup(const BlockHash& h) const {
  if (!caching_)
    return -1;
  const auto it = by_hash_.find(h);
  return it == by_hash_.end() ? -1 : it->second;
}

void BlockPool::cache(int32_t b, const BlockHash& h) {
  XSERV_CHECK(b > kNullBlock && b < int32_t(refs_.size()) && refs_[size_t(b)] > 0,
              fmt::format("KV block {} cached while free", b));
  if (!caching_ || has_hash_[size_t(b)])
    return;
  if (!by_hash_.emplace(h, b).second)
    return; // another block holds this prefix already
  hash_[size_t(b)] = h;
  has_hash_[size_t(b)] = true;
}

} // namespace xserv::engine::kv
