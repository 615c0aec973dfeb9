// ParamLayout, split_step() and validate_step().
#include "engine/step_split.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/error.h"
#include "models/gpt_oss.h"

namespace xserv::engine {

ParamLayout::ParamLayout(size_t tokens, size_t seqs) {
  for (const char* n :
       {models::params::kTokenIds, models::params::kPositions, models::params::kTokenSeq}) {
    offset[n] = total;
    total += tokens;
  }
  for (const char* n :
       {models::params::kCtxLens, models::params::kCacheRows, models::params::kLogitRows}) {
    offset[n] = total;
    total += seqs;
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
    sub.cache_rows.push_back(in.cache_rows[p.seq]);
  }
  return sub;
}

void validate_step(const models::StepInput& in, int64_t max_batch, int64_t max_seq, int64_t vocab) {
  if (static_cast<int64_t>(in.tokens.size()) > max_batch)
    throw Error(fmt::format("{} sequences in one step exceed the maximum batch of {}",
                            in.tokens.size(), max_batch));
  if (in.ctx_lens.size() != in.tokens.size() || in.cache_rows.size() != in.tokens.size())
    throw Error("step has mismatched sequence, context length and cache row counts");
  for (size_t b = 0; b < in.tokens.size(); ++b) {
    if (in.tokens[b].empty())
      throw Error(fmt::format("sequence {} has no tokens in this step", b));
    if (in.ctx_lens[b] < 0 || in.ctx_lens[b] + static_cast<int64_t>(in.tokens[b].size()) > max_seq)
      throw Error(fmt::format("sequence {}: {} cached + {} new tokens exceed the maximum sequence "
                              "length of {}",
                              b, in.ctx_lens[b], in.tokens[b].size(), max_seq));
    if (in.cache_rows[b] < 0 || in.cache_rows[b] >= max_batch)
      throw Error(fmt::format("sequence {} uses cache row {}, but there are {} rows", b,
                              in.cache_rows[b], max_batch));
    for (int32_t id : in.tokens[b])
      if (id < 0 || id >= vocab)
        throw Error(fmt::format("token id {} is outside the vocabulary [0, {})", id, vocab));
  }
}

} // namespace xserv::engine
