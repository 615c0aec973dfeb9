// step_params(): flattening a batch of sequences into the graph's runtime inputs.
#include "models/step.h"

#include <fmt/format.h>

#include "base/error.h"
#include "models/gpt_oss.h"

namespace xserv::models {

std::map<std::string, ir::Tensor> step_params(const StepInput& step) {
  const size_t nseq = step.tokens.size();
  if (step.ctx_lens.size() != nseq || step.cache_rows.size() != nseq)
    throw Error(fmt::format("step has {} sequences but {} context lengths and {} cache rows", nseq,
                            step.ctx_lens.size(), step.cache_rows.size()));
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
  p[params::kCacheRows] = ir::Tensor::from_ints({n}, step.cache_rows);
  p[params::kLogitRows] = ir::Tensor::from_ints({n}, last);
  return p;
}

} // namespace xserv::models
