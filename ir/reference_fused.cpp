// The fp32 reference math of the fused ops, composed from the plain ops' reference functions.
#include "ir/reference.h"

namespace xserv::ir::ref {
namespace {

/// A linear's [T,N] output viewed as [T, N/head_dim, head_dim] (what reshape does).
Tensor heads(Tensor t, int64_t head_dim) {
  const int64_t rows = t.dim(0), n = t.dim(1);
  t.shape = {rows, n / head_dim, head_dim};
  return t;
}

} // namespace

Tensor rms_norm_linear(const Tensor& x, const Tensor& ln, double eps, const Tensor& w,
                       const Tensor* b) {
  return linear(rms_norm(x, ln, eps), w, b);
}

Qkv qkv_rope(const Tensor& x, const Tensor& ln, double eps, const Tensor& wq, const Tensor& bq,
             const Tensor& wk, const Tensor& bk, const Tensor& wv, const Tensor& bv,
             const Tensor& positions, int64_t head_dim, const Yarn& y) {
  const Tensor xn = rms_norm(x, ln, eps);
  Qkv r;
  r.q = rope_yarn(heads(linear(xn, wq, &bq), head_dim), positions, y);
  r.k = rope_yarn(heads(linear(xn, wk, &bk), head_dim), positions, y);
  r.v = heads(linear(xn, wv, &bv), head_dim);
  return r;
}

Tensor linear_residual(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& h) {
  return add(h, linear(x, w, b));
}

void router(const Tensor& x, const Tensor& w, const Tensor* b, int64_t k, Tensor& weights,
            Tensor& ids) {
  router_topk(linear(x, w, b), k, weights, ids);
}

Tensor moe_experts_residual(const Tensor& x, const Tensor& weights, const Tensor& ids,
                            const Tensor& gate_up, const Tensor& gate_up_bias, const Tensor& down,
                            const Tensor& down_bias, const Tensor& h, double limit, double alpha) {
  return add(h, moe_experts(x, weights, ids, gate_up, gate_up_bias, down, down_bias, limit, alpha));
}

} // namespace xserv::ir::ref
