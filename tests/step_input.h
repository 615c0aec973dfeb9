// A models::StepInput from its three per-sequence lists, for tests of how steps are taken apart.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "models/step.h"

namespace xserv::testing {

inline models::StepInput make_step(std::vector<std::vector<int32_t>> tokens,
                                   std::vector<int32_t> ctx_lens, std::vector<int32_t> cache_rows) {
  models::StepInput in;
  in.tokens = std::move(tokens);
  in.ctx_lens = std::move(ctx_lens);
  in.cache_rows = std::move(cache_rows);
  return in;
}

} // namespace xserv::testing
