// The fp32 reference math of every op, on host tensors: the executable definition of the IR.
#pragma once

#include "ir/tensor.h"

namespace xserv::ir::ref {

/// YaRN parameters of rope_yarn (MODEL.md, "YaRN RoPE").
struct Yarn {
  double theta = 150000.0;
  double factor = 32.0;
  double original_max = 4096.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = false;
};

/// Per-pair inverse frequencies (head_dim/2 of them) and the attention factor, in float64.
std::vector<double> yarn_inv_freq(const Yarn& y, int64_t head_dim);
double yarn_attention_factor(const Yarn& y);

/// Sequence bookkeeping shared by attention and kv_write: tokens of the step are flattened;
/// token t belongs to sequence token_seq[t] at position positions[t]; sequence b had
/// ctx_lens[b] tokens cached before this step, and its position j lives in slot j % BS of the
/// cache block table[b, j / BS] (a paged cache [blocks, BS, G, D]).
struct Batch {
  const Tensor& positions;
  const Tensor& token_seq;
  const Tensor& ctx_lens;
  const Tensor& table;
};

Tensor embedding(const Tensor& table, const Tensor& ids);
Tensor rms_norm(const Tensor& x, const Tensor& w, double eps);
/// y = x W^T (+ b): x [..,K], w [N,K], b [N] or null.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor* b);
Tensor add(const Tensor& a, const Tensor& b);
Tensor rope_yarn(const Tensor& x, const Tensor& positions, const Yarn& y);
/// Attention with sinks over the cache (positions before the step) and this step's k/v.
/// window = 0: causal over all positions; else keys j with p - window < j <= p.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_cache,
                 const Tensor& v_cache, const Tensor& sinks, const Batch& batch, int64_t window,
                 double scale);
/// Writes x [T,G,D] into the paged cache [blocks, BS, G, D]: token t at position p of sequence b
/// into slot p % BS of block table[b, p / BS]. With window > 0 a token is left out when its
/// sequence's token ring = ceil(window / BS) + 1 blocks later in the step lands in the same
/// block (a table that reuses a ring of blocks): no query after the step sees it, and the two
/// stores would race on a GPU.
void kv_write(Tensor& cache, const Tensor& x, const Batch& batch, int64_t window = 0);
/// Top-k of each row (ties: lower index first) and the softmax over the k selected values.
void router_topk(const Tensor& logits, int64_t k, Tensor& weights, Tensor& ids);
/// Mixture of experts with the clamped SwiGLU (MODEL.md, "MoE"); gate_up rows interleave
/// gate (even) and up (odd).
Tensor moe_experts(const Tensor& x, const Tensor& weights, const Tensor& ids, const Tensor& gate_up,
                   const Tensor& gate_up_bias, const Tensor& down, const Tensor& down_bias,
                   double limit, double alpha);
Tensor select_rows(const Tensor& x, const Tensor& rows);
Tensor argmax(const Tensor& x);

// Fused ops (ir/reference_fused.cpp): each is the composition of the plain functions above, in
// the order the unfused graph runs them, so fused and unfused graphs agree bit for bit.

/// rms_norm_linear: linear(rms_norm(x, ln, eps), w, b).
Tensor rms_norm_linear(const Tensor& x, const Tensor& ln, double eps, const Tensor& w,
                       const Tensor* b);
/// The three results of qkv_rope.
struct Qkv {
  Tensor q, k, v; ///< q [T,H,D] and k [T,G,D] rotated; v [T,G,D]
};
/// qkv_rope: xn = rms_norm(x, ln, eps); q = rope(linear(xn, wq, bq) as [T,H,D]),
/// k = rope(linear(xn, wk, bk) as [T,G,D]), v = linear(xn, wv, bv) as [T,G,D].
Qkv qkv_rope(const Tensor& x, const Tensor& ln, double eps, const Tensor& wq, const Tensor& bq,
             const Tensor& wk, const Tensor& bk, const Tensor& wv, const Tensor& bv,
             const Tensor& positions, int64_t head_dim, const Yarn& y);
/// linear_residual: h + linear(x, w, b).
Tensor linear_residual(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& h);
/// router: router_topk(linear(x, w, b), k).
void router(const Tensor& x, const Tensor& w, const Tensor* b, int64_t k, Tensor& weights,
            Tensor& ids);
/// moe_experts_residual: h + moe_experts(...).
Tensor moe_experts_residual(const Tensor& x, const Tensor& weights, const Tensor& ids,
                            const Tensor& gate_up, const Tensor& gate_up_bias, const Tensor& down,
                            const Tensor& down_bias, const Tensor& h, double limit, double alpha);

} // namespace xserv::ir::ref
