// The names of the graph's dynamic dimensions, which every layer that sizes a step or a cache
// agrees on (the model builder, the memory planner, the lowering, the runtime's layout).
#pragma once

namespace xserv::ir::dims {

inline constexpr const char* kTokens = "T";    ///< tokens in the step
inline constexpr const char* kSeqs = "B";      ///< sequences in the step
inline constexpr const char* kCacheRows = "N"; ///< KV-cache rows (the plan's max batch)
inline constexpr const char* kMaxSeq = "S";    ///< cache positions (the plan's max sequence)

} // namespace xserv::ir::dims
