// The runtime inputs of one forward step of build_gpt_oss()'s graph, from per-sequence tokens.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ir/tensor.h"

namespace xserv::models {

/// One step: for each sequence b, the new tokens, how many tokens its cache already holds, and
/// where its cached positions live: block_tables[b][i] is the KV block (of the full-attention
/// layers' pool) holding its positions i * block_size ..., window_tables[b][i] the same in the
/// sliding-window layers' pool. A table is as long as the sequence needs; a window table's
/// entries for positions no query reads again may be the null block 0 (engine/kv/block_pool.h),
/// whose contents nothing reads, or -1 where the step does not write them either.
struct StepInput {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int32_t> ctx_lens;
  std::vector<std::vector<int32_t>> block_tables;
  std::vector<std::vector<int32_t>> window_tables; ///< empty for a model without sliding layers
  /// Block copies to make before the step runs, in order (copy on write: a forked sequence's
  /// own copy of a shared, partly filled block), in every layer of the block's pool.
  struct BlockCopy {
    int32_t src = 0, dst = 0;
    bool window = false; ///< the sliding-window pool's blocks, else the full-attention pool's
    bool operator==(const BlockCopy&) const = default;
  };
  std::vector<BlockCopy> copies;
};

/// How a model's KV caches are paged.
struct KvGeometry {
  int64_t block_size = 16;   ///< positions per block
  int64_t table_blocks = 0;  ///< block table entries: the longest sequence in blocks (MB)
  int64_t window = 0;        ///< the sliding layers' window; 0: no sliding layers
  int64_t blocks = 0;        ///< blocks of the full-attention pool
  int64_t window_blocks = 0; ///< blocks of the sliding-window pool
  /// Blocks a sliding layer's query can see at most (its window, not aligned to blocks).
  int64_t ring_blocks() const {
    return window > 0 ? (window + block_size - 1) / block_size + 1 : 0;
  }
  /// Blocks for a sequence of `positions` positions.
  int64_t blocks_for(int64_t positions) const { return (positions + block_size - 1) / block_size; }
  /// Sequences of `row_blocks` blocks (default: table_blocks, the longest) that fit the pools
  /// as fixed rows after the null block (row_tables).
  int64_t rows(int64_t row_blocks = 0) const;
};

/// The tables of a sequence that owns fixed row `row` of the pools instead of blocks handed out
/// one by one (the benchmark, tests): rows of `row_blocks` blocks (0: table_blocks) after the
/// null block 0, full blocks 1 + row * row_blocks + i, and window blocks a ring of ring_blocks()
/// from 1 + row * ring_blocks() (entry i holds block i mod ring_blocks(), which no query needs
/// again once the sequence is ring_blocks() blocks further). Throws xserv::Error for a row past
/// rows(row_blocks).
void row_tables(const KvGeometry& g, int32_t row, std::vector<int32_t>& block_table,
                std::vector<int32_t>& window_table, int64_t row_blocks = 0);

/// Fills in.block_tables and in.window_tables from `rows` (one per sequence) with row_tables().
void assign_rows(StepInput& in, const std::vector<int32_t>& rows, const KvGeometry& g,
                 int64_t row_blocks = 0);

/// The graph params (token_ids, positions, token_seq, ctx_lens, block_table, window_table,
/// logit_rows) for a step: tokens flattened sequence by sequence, positions continuing each
/// cache, logits taken at each sequence's last new token, the tables padded with -1 to the
/// longest of the step. Throws xserv::Error when a sequence has no tokens or the lists disagree
/// in length.
std::map<std::string, ir::Tensor> step_params(const StepInput& step);

} // namespace xserv::models
