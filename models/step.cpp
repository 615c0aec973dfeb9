// step_params(): flattening a batch of sequences into the graph's runtime inputs.
#include "models/step.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/error.h"
#include "models/gpt_oss.h"

namespace xserv::models {

int64_t KvGeometry::rows(int64_t row_blocks) const {
  const int64_t per = row_blocks > 0 ? row_blocks : table_blocks;
  int64_t rows = per > 0 ? std::max<int64_t>(blocks - 1, 0) / per : 0; // block 0: the null block
  if (window > 0)
    rows = std::min(rows, std::max<int64_t>(window_blocks - 1, 0) / ring_blocks());
  return rows;
}

void row_tables(const KvGeometry& g, int32_t row, std::vector<int32_t>& block_table,
                std::vector<int32_t>& window_table, int64_t row_blocks) {
  const int64_t per = row_blocks > 0 ? row_blocks : g.table_blocks;
  if (row < 0 || row >= g.rows(per))
    throw Error(fmt::format("KV row {} is outside the {} rows of {} positions the pools hold", row,
                            g.rows(per), per * g.block_size));
  block_table.resize(static_cast<size_t>(per));
  for (int64_t i = 0; i < per; ++i)
    block_table[size_t(i)] = static_cast<int32_t>(1 + row * per + i);
  window_table.clear();
  if (g.window > 0) {
    const int64_t ring = g.ring_blocks();
    window_table.resize(static_cast<size_t>(per));
    for (int64_t i = 0; i < per; ++i)
      window_table[size_t(i)] = static_cast<int32_t>(1 + row * ring + i % ring);
  }
}

void assign_rows(StepInput& in, const std::vector<int32_t>& rows, const KvGeometry& g,
                 int64_t row_blocks) {
  if (rows.size() != in.tokens.size())
    throw Error(fmt::format("{} KV rows for {} sequences", rows.size(), in.tokens.size()));
  in.block_tables.assign(rows.size(), {});
  in.window_tables.assign(g.window > 0 ? rows.size() : 0, {});
  std::vector<int32_t> unused;
  for (size_t b = 0; b < rows.size(); ++b)
    row_tables(g, rows[b], in.block_tables[b], g.window > 0 ? in.window_tables[b] : unused,
               row_blocks);
}

std::map<std::string, ir::Tensor> step_params(const StepInput& step) {
  const size_t nseq = step.tokens.size();
  if (step.ctx_lens.size() != nseq || step.block_tables.size() != nseq ||
      (!step.window_tables.empty() && step.window_tables.size() != nseq))
    throw Error(fmt::format("step has {} sequences but {} context lengths, {} block tables and {} "
                            "window tables",
                            nseq, step.ctx_lens.size(), step.block_tables.size(),
                            step.window_tables.size()));
  std::vector<int32_t> ids, pos, seq, last;
  for (size_t b = 0; b < nseq; ++b) {
    if (step.tokens[b].empty())
      throw Error(fmt::format("sequence {} has no tokens in this step", b));
    for (size_t i = 0; i < step.tokens[b].size(); ++i) {
      ids.push_back(step.tokens[b][i]);
      pos.push_back(step.ctx_lens[b] + static_cast<int32_t>(i));
      seq.push_back(static_cast<int32_t>(b));
    }
    last.push_back(static_cast<int32_t>(ids.size()) - 1);
  }
  const int64_t t = static_cast<int64_t>(ids.size()), n = static_cast<int64_t>(nseq);
  std::map<std::string, ir::Tensor> p;
  p[params::kTokenIds] = ir::Tensor::from_ints({t}, ids);
  p[params::kPositions] = ir::Tensor::from_ints({t}, pos);
  p[params::kTokenSeq] = ir::Tensor::from_ints({t}, seq);
  p[params::kCtxLens] = ir::Tensor::from_ints({n}, step.ctx_lens);
  p[params::kLogitRows] = ir::Tensor::from_ints({n}, last);
  // Both tables at the width of the longest (their dimension MB is one), padded with -1.
  size_t width = 1;
  for (const auto* tables : {&step.block_tables, &step.window_tables})
    for (const std::vector<int32_t>& t : *tables)
      width = std::max(width, t.size());
  auto table = [&](const std::vector<std::vector<int32_t>>& tables) {
    std::vector<int32_t> flat(nseq * width, -1);
    for (size_t b = 0; b < tables.size(); ++b)
      std::copy(tables[b].begin(), tables[b].end(), flat.begin() + std::ptrdiff_t(b * width));
    return ir::Tensor::from_ints({n, static_cast<int64_t>(width)}, flat);
  };
  p[params::kBlockTable] = table(step.block_tables);
  if (!step.window_tables.empty())
    p[params::kWindowTable] = table(step.window_tables);
  return p;
}

} // namespace xserv::models
