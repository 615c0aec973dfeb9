// models::StepInput for tests: sequences in fixed rows of a model's KV pools (models::row_tables),
// and the tables a continuation of a step keeps.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "ir/dims.h"
#include "ir/graph.h"
#include "models/gpt_oss.h"
#include "models/step.h"

namespace xserv::testing {

/// A step of sequences that own rows `rows` of the pools of `kv`.
inline models::StepInput make_step(std::vector<std::vector<int32_t>> tokens,
                                   std::vector<int32_t> ctx_lens, const std::vector<int32_t>& rows,
                                   const models::KvGeometry& kv) {
  models::StepInput in;
  in.tokens = std::move(tokens);
  in.ctx_lens = std::move(ctx_lens);
  models::assign_rows(in, rows, kv);
  return in;
}

/// Gives the sequences of `in` rows `rows` of the pools of `kv`.
inline void use_rows(models::StepInput& in, const std::vector<int32_t>& rows,
                     const models::KvGeometry& kv) {
  models::assign_rows(in, rows, kv);
}

/// Appends sequence b of `step`'s tables to `next` (a continuation of that sequence).
inline void keep_tables(models::StepInput& next, const models::StepInput& step, size_t b) {
  next.block_tables.push_back(step.block_tables.at(b));
  if (!step.window_tables.empty())
    next.window_tables.push_back(step.window_tables.at(b));
}

/// The paging of `g`'s caches with pools of `rows` rows of `max_seq` positions (what an
/// interpreter test binds: pool_dims).
inline models::KvGeometry row_geometry(const ir::Graph& g, int64_t rows, int64_t max_seq) {
  models::KvGeometry k = models::kv_geometry(g, max_seq);
  k.blocks = rows * k.table_blocks + 1; // and the null block
  k.window_blocks = rows * k.ring_blocks() + 1;
  return k;
}

/// The interpreter's bindings of the pools' block counts.
inline ir::DimBindings pool_dims(const models::KvGeometry& k) {
  return {{ir::dims::kKvBlocks, k.blocks},
          {ir::dims::kWindowBlocks, std::max<int64_t>(k.window_blocks, 1)}};
}

} // namespace xserv::testing
