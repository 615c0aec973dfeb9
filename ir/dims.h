// The names of the graph's dynamic dimensions, which every layer that sizes a step or a cache
// agrees on (the model builder, the memory planner, the lowering, the runtime's layout).
#pragma once

namespace xserv::ir::dims {

inline constexpr const char* kTokens = "T"; ///< tokens in the step
inline constexpr const char* kSeqs = "B";   ///< sequences in the step
/// Blocks of the KV pool of the full-attention layers, and of the sliding-window layers: sized
/// when a model loads, from the memory it is given.
inline constexpr const char* kKvBlocks = "NB";
inline constexpr const char* kWindowBlocks = "NW";
/// Entries of a sequence's block table: the plan's max sequence in blocks.
inline constexpr const char* kTableBlocks = "MB";
/// Positions of the longest sequence (the plan's max sequence).
inline constexpr const char* kMaxSeq = "S";

} // namespace xserv::ir::dims
