// build_gpt_oss(): the whole gpt-oss forward pass as one IR graph, for prefill and decode alike.
#pragma once

#include "ir/dims.h"
#include "ir/graph.h"
#include "models/config.h"
#include "models/step.h"

namespace xserv::models {

/// What the graph returns.
struct BuildOptions {
  /// true: logits only for one row per sequence (the `logit_rows` param picks which token,
  /// normally each sequence's last), f32[B,V]; false: logits for every token, f32[T,V].
  bool last_logits_only = true;
  /// Also return the greedy next token of each logits row (argmax), i32[B] or i32[T].
  bool greedy = false;
  /// Element type of the KV caches: f32 keeps the step's keys and values exact (the GPU path
  /// then tracks fp32 references far more closely, which matters at router near-ties), bf16
  /// halves their memory and the bytes a long-context decode reads.
  ir::DType kv_dtype = ir::DType::F32;
  /// Positions per KV-cache block (the caches are paged: [blocks, kv_block, kv heads, head dim]).
  int64_t kv_block = 16;
};

/// Names of the graph's runtime inputs (param nodes).
namespace params {
inline constexpr const char* kTokenIds = "token_ids";   ///< i32[T]
inline constexpr const char* kPositions = "positions";  ///< i32[T], position in its sequence
inline constexpr const char* kTokenSeq = "token_seq";   ///< i32[T], sequence index in [0, B)
inline constexpr const char* kCtxLens = "ctx_lens";     ///< i32[B], cached tokens before step
inline constexpr const char* kLogitRows = "logit_rows"; ///< i32[B], token whose logits to return
/// i32[B, MB]: per sequence, the KV block of each block of positions of the full-attention
/// layers' caches (position j: block table[b, j / kv_block], slot j % kv_block).
inline constexpr const char* kBlockTable = "block_table";
/// i32[B, MB]: the same for the sliding-window layers' caches (their own, smaller pool); only
/// the blocks a query can still see need a valid entry.
inline constexpr const char* kWindowTable = "window_table";
} // namespace params

/// Emits the forward pass of MODEL.md for `cfg`: embedding, the decoder layers (sliding-window
/// attention where cfg says so; every layer's KV cache paged in blocks of opts.kv_block
/// positions, the full-attention layers' from one pool through block_table, the sliding ones'
/// from another through window_table), final norm and lm_head. One step processes T tokens of B
/// sequences; each layer reads its KV cache for earlier positions and writes this step's keys and
/// values after attention. Weights carry their Hugging Face names; MXFP4 expert matrices are single
/// `mxfp4` weights named without the _blocks/_scales suffix.
ir::Graph build_gpt_oss(const ModelConfig& cfg, const BuildOptions& opts = {});

/// The paging of `g`'s KV caches (its cache nodes' block size, its attention nodes' largest
/// window) for sequences of up to `max_seq` positions; the pools' blocks are left 0. Throws
/// xserv::Error for a graph whose caches disagree on the block size.
KvGeometry kv_geometry(const ir::Graph& g, int64_t max_seq);

} // namespace xserv::models
