// The runtime inputs of one forward step of build_gpt_oss()'s graph, from per-sequence tokens.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ir/tensor.h"

namespace xserv::models {

/// One step: for each sequence b, the new tokens, how many tokens its cache already holds, and
/// which cache row it owns.
struct StepInput {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int32_t> ctx_lens;
  std::vector<int32_t> cache_rows;
};

/// The graph params (token_ids, positions, token_seq, ctx_lens, cache_rows, logit_rows) for a
/// step: tokens flattened sequence by sequence, positions continuing each cache, logits taken
/// at each sequence's last new token. Throws xserv::Error when a sequence has no tokens or
/// the lists disagree in length.
std::map<std::string, ir::Tensor> step_params(const StepInput& step);

} // namespace xserv::models
