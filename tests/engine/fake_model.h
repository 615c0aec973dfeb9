// A fake engine::Model for scheduler tests: paged KV pools that hold token ids instead of keys,
// written and read through the step's block tables exactly as attention would, and logits that
// hash every position a step's attention could read, so that any scheduling or paging mistake
// (a sequence reading another's block, a stale block, a block freed while in use) changes tokens.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/model.h"

namespace xserv::testing {

class FakeModel : public engine::Model {
public:
  static constexpr int32_t kVocab = 97;
  static constexpr int64_t kBlock = 4;

  /// `rows` sequences of `max_seq` positions a step at most; the full pool holds `blocks` blocks
  /// of kBlock positions (default: `rows` sequences of max_seq and the null block), and `window`
  /// > 0 gives the model sliding layers of that window (their own pool of `window_blocks`,
  /// default twice the rows' rings and the null block).
  FakeModel(int64_t rows, int64_t max_seq, int64_t blocks = 0, int64_t window = 0,
            int64_t window_blocks = 0)
      : rows_(rows), max_seq_(max_seq) {
    config_.vocab_size = kVocab;
    kv_.block_size = kBlock;
    kv_.table_blocks = kv_.blocks_for(max_seq);
    kv_.window = window;
    kv_.blocks = blocks > 0 ? blocks : rows * kv_.table_blocks + 1;
    kv_.window_blocks = window == 0         ? 0
                        : window_blocks > 0 ? window_blocks
                                            : 2 * rows * kv_.ring_blocks() + 1;
    full_.assign(size_t(kv_.blocks * kBlock), -1);
    sliding_.assign(size_t(std::max<int64_t>(kv_.window_blocks, 1) * kBlock), -1);
  }

  const models::ModelConfig& config() const override { return config_; }
  int64_t max_batch() const override { return rows_; }
  int64_t max_seq() const override { return max_seq_; }
  const models::KvGeometry& kv_geometry() const override { return kv_; }
  std::string backend() const override { return "fake"; }
  void reset() override {
    std::fill(full_.begin(), full_.end(), -1);
    std::fill(sliding_.begin(), sliding_.end(), -1);
  }

  /// Reads each sequence's cached positions through its tables (all of them in the full pool;
  /// the last `window` before its first new token in the sliding pool), writes its new tokens
  /// (the sliding pool: the step's last `window` of them), and returns logits that hash what it
  /// read and wrote: position p's value, or -1 for a slot never written.
  std::vector<std::vector<float>> step(const models::StepInput& in) override {
    steps_.push_back(in);
    if (in.tokens.size() != in.ctx_lens.size() || in.tokens.size() != in.block_tables.size() ||
        (kv_.window > 0 && in.window_tables.size() != in.tokens.size()))
      throw std::logic_error("malformed step");
    if (int64_t(in.tokens.size()) > rows_)
      throw std::logic_error("more sequences than the model's max batch");
    for (const models::StepInput::BlockCopy& c : in.copies) { // copies on write, first
      std::vector<int32_t>& pool = c.window ? sliding_ : full_;
      const int64_t blocks = c.window ? kv_.window_blocks : kv_.blocks;
      if (c.src <= 0 || c.dst <= 0 || c.src >= blocks || c.dst >= blocks)
        throw std::logic_error("a block copy outside the pool or of the null block");
      std::copy_n(pool.begin() + c.src * kBlock, kBlock, pool.begin() + c.dst * kBlock);
    }
    std::vector<std::vector<float>> out;
    for (size_t b = 0; b < in.tokens.size(); ++b) {
      const int64_t ctx = in.ctx_lens[b], n = int64_t(in.tokens[b].size());
      if (n == 0 || ctx + n > max_seq_)
        throw std::logic_error("a sequence beyond max_seq or without tokens");
      // Every position's value up to the step's last, from the full pool below ctx and from the
      // step's tokens after: the same hash however the sequence was chunked or cached.
      uint64_t h = 0x9e3779b97f4a7c15ull;
      for (int64_t p = 0; p < ctx; ++p)
        h = mix(h ^ uint64_t(uint32_t(full_[slot(in.block_tables[b], p, kv_.blocks, true)]) + 1));
      for (int64_t i = 0; i < n; ++i)
        h = mix(h ^ uint64_t(uint32_t(in.tokens[b][size_t(i)]) + 1));
      if (kv_.window > 0) {
        // The sliding pool must hold every position the first new token's window reads, equal
        // to the full pool's; the last token's window goes into the hash.
        for (int64_t p = std::max<int64_t>(0, ctx - kv_.window + 1); p < ctx; ++p)
          if (sliding_[slot(in.window_tables[b], p, kv_.window_blocks, true)] !=
              full_[slot(in.block_tables[b], p, kv_.blocks, true)])
            throw std::logic_error("sequence " + std::to_string(b) + " reads position " +
                                   std::to_string(p) + " from a stale sliding-window block");
        for (int64_t p = std::max<int64_t>(0, ctx + n - kv_.window); p < ctx + n; ++p) {
          const int32_t v = p < ctx
                                ? sliding_[slot(in.window_tables[b], p, kv_.window_blocks, true)]
                                : in.tokens[b][size_t(p - ctx)];
          h = mix(h ^ uint64_t(uint32_t(v) + 7));
        }
      }
      // Then the writes, as kv_write does them (a sliding layer's token is left out when a
      // later one lands in the same slot of a ring table).
      const int64_t ring = kv_.ring_blocks();
      for (int64_t i = 0; i < n; ++i) {
        const int64_t p = ctx + i;
        full_[slot(in.block_tables[b], p, kv_.blocks, false)] = in.tokens[b][size_t(i)];
        if (kv_.window == 0)
          continue;
        const auto j = size_t(p / kBlock);
        if (i + ring * kBlock < n &&
            in.window_tables[b][j] == in.window_tables[b][j + size_t(ring)])
          continue;
        sliding_[slot(in.window_tables[b], p, kv_.window_blocks, false)] = in.tokens[b][size_t(i)];
      }
      std::vector<float> logits(kVocab);
      for (int32_t v = 0; v < kVocab; ++v)
        logits[size_t(v)] = float(mix(h + uint64_t(v)) >> 40) / float(1 << 22); // in [0, 4)
      const int32_t first =
          ctx == 0 ? in.tokens[b][0] : full_[slot(in.block_tables[b], 0, kv_.blocks, true)];
      if (const auto p = poison_.find(first); p != poison_.end())
        logits[3] = p->second;
      out.push_back(std::move(logits));
    }
    return out;
  }

  /// From now on the logits of sequences whose first token is `first` hold `value` (a NaN, an
  /// infinity) at id 3, as a model whose numbers broke down would.
  void poison(int32_t first, float value) { poison_[first] = value; }

  const std::vector<models::StepInput>& steps() const { return steps_; }
  size_t max_seqs_in_a_step() const {
    size_t n = 0;
    for (const auto& s : steps_)
      n = std::max(n, s.tokens.size());
    return n;
  }

private:
  static uint64_t mix(uint64_t x) { // splitmix64's finaliser
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }

  /// The slot of position p through `table`, checked as a kernel would need it to be (a read
  /// never from the null block, block 0).
  static size_t slot(const std::vector<int32_t>& table, int64_t p, int64_t blocks, bool read) {
    const size_t i = size_t(p / kBlock);
    if (i >= table.size() || table[i] < 0 || table[i] >= blocks)
      throw std::logic_error("position " + std::to_string(p) + " has no valid block");
    if (table[i] == 0 && read)
      throw std::logic_error("position " + std::to_string(p) + " is read from the null block");
    return size_t(table[i]) * size_t(kBlock) + size_t(p % kBlock);
  }

  models::ModelConfig config_;
  models::KvGeometry kv_;
  int64_t rows_, max_seq_;
  std::vector<int32_t> full_, sliding_;
  std::vector<models::StepInput> steps_;
  std::map<int32_t, float> poison_;
};

} // namespace xserv::testing
