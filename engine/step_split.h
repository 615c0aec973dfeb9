// How a step reaches the GPU: checked against the model's limits, cut into sub-steps that fit
// the activation arena, and its inputs laid out in one int32 block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "models/step.h"

namespace xserv::engine {

/// Where each step input (models::params) lives in the param block, in int32 elements: the
/// per-token inputs for `tokens` tokens, the per-sequence ones for `seqs` sequences, then the
/// block tables, `seqs` rows of `table_blocks` entries each (the window table only `window`).
struct ParamLayout {
  std::map<std::string, size_t> offset;
  size_t total = 0;
  size_t table_blocks = 0; ///< entries of a table row
  ParamLayout(size_t tokens, size_t seqs, size_t table_blocks, bool window);
};

/// One sequence's slice of the step's tokens that a sub-step processes.
struct Piece {
  size_t seq;
  size_t start, len;
};

/// Splits a step into sub-steps, sub-step i of at most cap(i) tokens (cap(i) >= 1), sequence by
/// sequence; the pieces of a sequence keep their order, so each sub-step sees the earlier ones
/// in the KV cache.
std::vector<std::vector<Piece>> split_step(const models::StepInput& in,
                                           const std::function<size_t(size_t)>& cap);
/// split_step with the same capacity `cap` for every sub-step.
std::vector<std::vector<Piece>> split_step(const models::StepInput& in, size_t cap);

/// A sub-step's own step input: its pieces' tokens, context lengths (advanced by each piece's
/// start) and block tables.
models::StepInput piece_step(const models::StepInput& in, const std::vector<Piece>& pieces);

/// Whether `p` holds its sequence's last token of the step (its logits row is the sequence's).
inline bool ends_sequence(const models::StepInput& in, const Piece& p) {
  return p.start + p.len == in.tokens[p.seq].size();
}

/// Checks a step against a model's limits: throws xserv::Error naming the limit (batch,
/// sequence length, vocabulary, a block the step reads or writes that is missing or outside its
/// pool) or the malformed part.
void validate_step(const models::StepInput& in, int64_t max_batch, int64_t max_seq, int64_t vocab,
                   const models::KvGeometry& kv);

} // namespace xserv::engine
