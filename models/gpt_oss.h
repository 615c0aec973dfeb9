// build_gpt_oss(): the whole gpt-oss forward pass as one IR graph, for prefill and decode alike.
#pragma once

#include "ir/dims.h"
#include "ir/graph.h"
#include "models/config.h"

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
};

/// Names of the graph's runtime inputs (param nodes).
namespace params {
inline constexpr const char* kTokenIds = "token_ids";   ///< i32[T]
inline constexpr const char* kPositions = "positions";  ///< i32[T], position in its sequence
inline constexpr const char* kTokenSeq = "token_seq";   ///< i32[T], sequence index in [0, B)
inline constexpr const char* kCtxLens = "ctx_lens";     ///< i32[B], cached tokens before step
inline constexpr const char* kCacheRows = "cache_rows"; ///< i32[B], KV cache row per sequence
inline constexpr const char* kLogitRows = "logit_rows"; ///< i32[B], token whose logits to return
} // namespace params

/// Emits the forward pass of MODEL.md for `cfg`: embedding, the decoder layers (sliding-window
/// attention where cfg says so, with a ring cache of sliding_window slots; full attention with
/// S slots), final norm and lm_head. One step processes T tokens of B sequences; each layer reads
/// its KV cache for earlier positions and writes this step's keys and values after attention.
/// Weights carry their Hugging Face names; MXFP4 expert matrices are single `mxfp4` weights
/// named without the _blocks/_scales suffix.
ir::Graph build_gpt_oss(const ModelConfig& cfg, const BuildOptions& opts = {});

} // namespace xserv::models
