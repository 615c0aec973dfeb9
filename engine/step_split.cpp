// ParamLayout, split_step() and validate_step().
#include "engine/step_split.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/error.h"
#include "models/gpt_oss.h"

namespace xserv::engine {

ParamLayout::ParamLayout(size_t tokens, size_t seqs, size_t table_blocks_, bool window)
    : table_blocks(table_blocks_) {
  for (const char* n :
       {models::params::kTokenIds, models::params::kPositions, models::params::kTokenSeq}) {
    offset[n] = total;
    total += tokens;
  }
  for (const char* n : {models::params::kCtxLens, models::params::kLogitRows}) {
    offset[n] = total;
    total += seqs;
  }
  offset[models::params::kBlockTable] = total;
  total += seqs * table_blocks;
  if (window) {
    offset[models::params::kWindowTable] = total;
    total += seqs * table_blocks;
  }
}

std::vector<std::vector<Piece>> split_step(const models::StepInput& in,
                                           const std::function<size_t(size_t)>& cap) {
  std::vector<std::vector<Piece>> subs(1);
  size_t used = 0;
  for (size_t b = 0; b < in.tokens.size(); ++b)
    for (size_t off = 0; off < in.tokens[b].size();) {
      if (used == cap(subs.size() - 1)) {
        subs.emplace_back();
        used = 0;
      }
      const size_t take = std::min(in.tokens[b].size() - off, cap(subs.size() - 1) - used);
      subs.back().push_back({b, off, take});
      off += take;
      used += take;
    }
  return subs;
}

std::vector<std::vector<Piece>> split_step(const models::StepInput& in, size_t cap) {
  return split_step(in, [cap](size_t) { return cap; });
}

models::StepInput piece_step(const models::StepInput& in, const std::vector<Piece>& pieces) {
  models::StepInput sub;
  for (const Piece& p : pieces) {
    const auto& toks = in.tokens[p.seq];
    sub.tokens.emplace_back(toks.begin() + static_cast<long>(p.start),
                            toks.begin() + static_cast<long>(p.start + p.len));
    sub.ctx_lens.push_back(in.ctx_lens[p.seq] + static_cast<int32_t>(p.start));
    sub.block_tables.push_back(in.block_tables[p.seq]);
    if (!in.window_tables.empty())
      sub.window_tables.push_back(in.window_tables[p.seq]);
  }
  return sub;
}

namespace {

/// Checks that `table` names a block of a pool of `blocks` for every position in [lo, hi).
void check_blocks(const std::vector<int32_t>& table, int64_t lo, int64_t hi, int64_t block_size,
                  int64_t blocks, size_t seq, const char* which) {
  for (int64_t i = std::max<int64_t>(lo, 0) / block_size; i * block_size < hi; ++i) {
    const int64_t blk = i < int64_t(table.size()) ? table[size_t(i)] : -1;
    if (blk < 0 || blk >= blocks)
      throw Error(fmt::format("sequence {}: positions {}..{} need {} block {}, which is {} (the "
                              "pool has {} blocks)",
                              seq, i * block_size, (i + 1) * block_size - 1, which, i,
                              blk < 0 ? std::string("missing") : fmt::format("block {}", blk),
                              blocks));
  }
}

} // namespace

void validate_step(const models::StepInput& in, int64_t max_batch, int64_t max_seq, int64_t vocab,
                   const models::KvGeometry& kv) {
  if (static_cast<int64_t>(in.tokens.size()) > max_batch)
    throw Error(fmt::format("{} sequences in one step exceed the maximum batch of {}",
                            in.tokens.size(), max_batch));
  if (in.ctx_lens.size() != in.tokens.size() || in.block_tables.size() != in.tokens.size() ||
      (kv.window > 0 && in.window_tables.size() != in.tokens.size()))
    throw Error("step has mismatched sequence, context length and block table counts");
  for (const models::StepInput::BlockCopy& c : in.copies) {
    const int64_t blocks = c.window ? kv.window_blocks : kv.blocks;
    if ((c.window && kv.window == 0) || c.src < 1 || c.src >= blocks || c.dst < 1 ||
        c.dst >= blocks || c.src == c.dst)
      throw Error(fmt::format("a copy of {} block {} to block {} (the pool has {} blocks, block "
                              "0 the null block)",
                              c.window ? "sliding-window" : "full-attention", c.src, c.dst,
                              blocks));
  }
  for (size_t b = 0; b < in.tokens.size(); ++b) {
    if (in.tokens[b].empty())
      throw Error(fmt::format("sequence {} has no tokens in this step", b));
    if (in.ctx_lens[b] < 0 || in.ctx_lens[b] + static_cast<int64_t>(in.tokens[b].size()) > max_seq)
      throw Error(fmt::format("sequence {}: {} cached + {} new tokens exceed the maximum sequence "
                              "length of {}",
                              b, in.ctx_lens[b], in.tokens[b].size(), max_seq));
    // Every position up to the step's last reads or is written in the full layers' blocks;
    // the sliding layers read back to a window before the first new token and write the
    // step's positions (those no later query reads may go to the null block).
    const int64_t ctx = in.ctx_lens[b], end = ctx + static_cast<int64_t>(in.tokens[b].size());
    check_blocks(in.block_tables[b], 0, end, kv.block_size, kv.blocks, b, "full-attention");
    if (kv.window > 0)
      check_blocks(in.window_tables[b], ctx - kv.window + 1, end, kv.block_size, kv.window_blocks,
                   b, "sliding-window");
    for (int32_t id : in.tokens[b])
      if (id < 0 || id >= vocab)
        throw Error(fmt::format("token id {} is outside the vocabulary [0, {})", id, vocab));
  }
}

} // namespace xserv::engine
