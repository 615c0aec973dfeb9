// The kernels and launch table entries of each fused op (Lowerer's lower_* members): dense
// linears (decode GEMVs, split-K and tiled gemms), q/k/v with RoPE and the KV writes,
// attention, the router, the MoE experts.
#include <algorithm>

#include "codegen/cuda_lower_detail.h"
#include "codegen/emit_prefill.h"
#include "ir/interpreter.h"
#include "ir/reference.h"

namespace xserv::codegen::lowering {

void Lowerer::add_splitk_reduce(DenseGemm& k, const codegen::LinearDims& d, int64_t rows) {
  if (k.splitk <= 1)
    return;
  k.reduce = k_.add(codegen::emit_gemm_splitk_reduce(d.n, k.splitk, d.bias, d.residual,
                                                     {"sums the split-K partials of a gemm"}));
  k.part = partials(size_t(k.splitk) * size_t(rows) * size_t(d.n) * sizeof(float));
}

LaunchArg Lowerer::partials(size_t bytes) {
  if (bytes > splitk_bytes_) {
    splitk_part_ = allocate(bytes);
    splitk_bytes_ = bytes;
  }
  return splitk_part_;
}

Lowerer::DenseGemm Lowerer::dense_gemm(const codegen::LinearDims& d, ValueId v, bool library) {
  DenseGemm k;
  if (!gemm_path() || !codegen::gemm_fits(d.k))
    return k; // steps of many tokens run the decode GEMV 8 tokens at a time
  if (c_.wgmma)
    return dense_gemm_wg(d, v, library);
  codegen::GemmDims gd;
  gd.k = d.k;
  gd.n = d.n;
  gd.norm = d.norm;
  gd.bias = d.bias;
  gd.residual = d.residual;
  gd.split = c_.gemm_split;
  gd.bm = 64;
  k.large = k_.add(codegen::emit_gemm(gd, ir_lines(g_, v)));
  k.splitk = codegen::gemm_splitk(d.k, d.n);
  gd.splitk = k.splitk;
  if (k.splitk > 1) // raw partial sums; bias and residual come in the reduce
    gd.bias = gd.residual = false;
  add_splitk_reduce(k, d, kSmallGemmRows);
  gd.bm = 32;
  k.small32 = k_.add(codegen::emit_gemm(gd, ir_lines(g_, v)));
  gd.bm = 64;
  k.small64 = k_.add(codegen::emit_gemm(gd, ir_lines(g_, v)));
  if (d.norm)
    k.inv = k_.add(codegen::emit_row_inv_rms(
        d.k, d.eps, {"1 / rms of each row: the prologue of a normed gemm"}));
  return k;
}

void Lowerer::linear(int kernel, const DenseGemm& gemm, const codegen::LinearDims& d, Rows rows,
                     LaunchArg x, LaunchArg ln, LaunchArg w, LaunchArg b, LaunchArg h, LaunchArg y,
                     bool inv_ready, int kernel1) {
  const LaunchArg null;
  if (gemm.wg) { // the rows' bf16 activations (shared by the linears of one x), then the gemm
    const int lo = d.max_tokens + 1;
    const LaunchArg xl = c_.gemm_split ? wg_xl_ : null;
    // gemm_wg's small tiles up to kSmallGemmRows rows, or up to the library's first row.
    const int lib = gemm.library >= 0 ? gemm.lib_from : -1;
    const int small_hi = lib > 0 ? std::min(kSmallGemmRows, lib - 1) : kSmallGemmRows;
    if (!inv_ready) { // a library gemm's rows in K order (its own act kernel)
      const std::vector<LaunchArg> act = {x, d.norm ? ln : null, wg_xh_, xl};
      if (lib < 0 || lib > lo)
        emit(gemm.act, rows, lo, lib > 0 ? lib - 1 : -1, act);
      if (lib > 0)
        emit(gemm.lib_act, rows, lib, -1, act);
    }
    wg_act_of_ = x;
    wg_act_normed_ = d.norm;
    const std::vector<LaunchArg> whole = {wg_xh_, xl, w, b, h, y, null, null, null, rows_arg()};
    if (small_hi < lo) {
      // every gemm step on the library
    } else if (gemm.splitk == 1) {
      emit(gemm.small64, rows, lo, small_hi, whole);
    } else { // raw partial sums, then the reduce adds bias and residual
      emit(gemm.small64, rows, lo, small_hi,
           {wg_xh_, xl, w, null, null, gemm.part, null, null, null, rows_arg()});
      emit(gemm.reduce, rows, lo, small_hi, {gemm.part, b, h, y, rows_arg()});
    }
    if (lib > 0 && gemm.lib_reduce < 0) { // cuBLAS's sums are the output
      emit_library(gemm.library, rows, lib, -1, {wg_xh_, w, y});
    } else if (lib > 0) { // cuBLAS's raw sums, then bias and residual
      emit_library(gemm.library, rows, lib, -1, {wg_xh_, w, gemm.lib_part});
      emit(gemm.lib_reduce, rows, lib, -1, {gemm.lib_part, b, h, y, rows_arg()});
    } else if (gemm.large_split) {
      emit(gemm.large, rows, kSmallGemmRows + 1, -1,
           {wg_xh_, xl, w, null, null, gemm.part, null, null, null, rows_arg()});
      emit(gemm.reduce, rows, kSmallGemmRows + 1, -1, {gemm.part, b, h, y, rows_arg()});
    } else {
      emit(gemm.large, rows, kSmallGemmRows + 1, -1, whole);
    }
  } else if (gemm.large >= 0) {
    const int lo = d.max_tokens + 1;
    if (d.norm && !inv_ready)
      emit(gemm.inv, rows, lo, -1, {x, inv_rms_});
    const LaunchArg norm_inv = d.norm ? inv_rms_ : null;
    const std::vector<LaunchArg> whole = {x, norm_inv, ln,   w,    b,         h,
                                          y, null,     null, null, rows_arg()};
    if (gemm.splitk == 1) {
      emit(gemm.small32, rows, lo, 32, whole);
      emit(gemm.small64, rows, 33, kSmallGemmRows, whole);
    } else { // raw partial sums, then the reduce adds bias and residual
      const std::vector<LaunchArg> part = {x,         norm_inv, ln,   w,    null,      null,
                                           gemm.part, null,     null, null, rows_arg()};
      emit(gemm.small32, rows, lo, 32, part);
      emit(gemm.small64, rows, 33, kSmallGemmRows, part);
      emit(gemm.reduce, rows, lo, kSmallGemmRows, {gemm.part, b, h, y, rows_arg()});
    }
    emit(gemm.large, rows, kSmallGemmRows + 1, -1, whole);
  }
  if (d.max_tokens == 0) // the gemm serves every step (canonical plans' qkv and router)
    return;
  // The decode GEMV, d.max_tokens rows per launch, pointers advanced per chunk.
  const uint64_t fk = uint64_t(d.k) * sizeof(float), fn = uint64_t(d.n) * sizeof(float);
  std::vector<LaunchArg> args = {strided(x, fk)};
  if (d.norm)
    args.push_back(ln);
  args.push_back(w);
  if (d.bias)
    args.push_back(b);
  if (d.residual)
    args.push_back(strided(h, fn));
  args.push_back(strided(y, fn));
  args.push_back(rows_arg());
  if (kernel1 >= 0) // a one-row step has a kernel of its own (fewer registers)
    emit(kernel1, rows, 0, 1, args, 1);
  emit(kernel, rows, kernel1 >= 0 ? 2 : 0, gemm.large >= 0 || gemm.wg ? d.max_tokens : -1,
       std::move(args), d.max_tokens);
}

void Lowerer::lower_linear(ValueId v) {
  const Node& n = g_.node(v);
  codegen::LinearDims d;
  d.round_act = !c_.gemm_split;
  const bool norm = n.op == Op::RmsNormLinear, residual = n.op == Op::LinearResidual;
  const size_t wi = norm ? 2 : 1;
  d.norm = norm;
  d.residual = residual;
  d.k = static_dim(g_, n.inputs[wi], 1);
  d.n = static_dim(g_, n.inputs[wi], 0);
  const size_t plain = norm ? 4 : 3; // inputs without the optional bias
  d.bias = residual ? n.inputs.size() == 4 : n.inputs.size() == plain;
  if (norm)
    d.eps = n.attr_float("eps");
  // The linears without a norm (the attention output projection, lm_head) of decode steps on
  // tensor cores where they fit (plain bf16 activations, sm_90 plans: the tokens are the MMA's
  // columns; the 20b's o_proj 11.6 against 32.9 us at 8 tokens, lm_head 344 against 870). One
  // token: lm_head too (260 against 270 us), but o_proj keeps an FMA kernel: the tensor-core one
  // was no faster alone (9.3 against 9.5 us) and the token ~1% slower with it (docs/PERF.md,
  // "Tried and rejected").
  // With --gemm-order canonical, in the canonical order (linear_decode_mma's CHAIN) where the
  // steps above 8 tokens run gemm_wg: its K slots and its K splits, so that a token's outputs
  // are the same bits in a decode step as in the gemm of a larger one (docs/DESIGN.md, "The
  // gemms' canonical order").
  // In the natural K order (--gemm-order natural): one chain over K a row group, so the bytes in
  // flight come from the warps' rings alone: 16 chunks for the narrow o_proj (90 blocks of two
  // warps), 4 for lm_head's thousands of blocks.
  codegen::LinearDims dm = d;
  dm.mma = true;
  if (c_.wgmma && c_.canonical && gemm_path()) {
    dm.mma_chain = !c_.natural;
    dm.mma_natural = c_.natural;
    dm.mma_splits = c_.natural ? 1 : codegen::wg_splitk(d.k, d.n);
    if (c_.natural) // no deeper than the chain's K tiles need (small models)
      dm.mma_stages = std::clamp(d.k / 64 + 1, 2, d.n <= 8192 ? 16 : 4);
    if (!codegen::linear_mma_fits(dm)) {
      dm.mma_chain = dm.mma_natural = false;
      dm.mma_splits = dm.mma_stages = 0;
    }
  }
  // A natural plan keeps its order where the chained kernel does not fit: the gemm from one row.
  const bool gemm_only = c_.natural && gemm_path() && codegen::gemm_fits(d.k) && !dm.mma_natural;
  codegen::LinearDims dl = d;
  if (gemm_only)
    dl.max_tokens = 0;
  const bool mma = c_.wgmma && codegen::linear_mma_fits(dm);
  const int kernel = gemm_only ? -1 : k_.add(codegen::emit_linear(mma ? dm : d, ir_lines(g_, v)));
  // The attention output projection of a one-token step: a 1-token kernel. On sm_90 its blocks
  // copy their whole share of W into shared memory as they start (linear_decode_smem), which
  // the previous kernel's trigger lets them do while attention_combine runs; elsewhere 8 loads
  // in flight per lane (13.2 against 15.1 us for the 20b's o_proj in the bandwidth test).
  int kernel1 = -1;
  if (residual && !gemm_only && !(dm.mma_natural && mma)) { // natural: the one chained kernel
    codegen::LinearDims d1 = d;
    d1.max_tokens = 1;
    d1.unroll = 8;
    codegen::LinearDims ds = d1;
    ds.smem = true;
    if (dm.mma_chain) { // in the canonical order too, where its 8 warps are the gemm's K splits
      ds.mma_chain = true;
      ds.mma_splits = dm.mma_splits;
      if (!codegen::linear_smem_chain_fits(ds))
        ds.mma_chain = false;
    }
    const bool smem = c_.wgmma && codegen::linear_smem_rows(ds) > 0;
    // A chained plan whose one-token kernel cannot chain: the chained kernel takes one token too.
    if (!(dm.mma_chain && mma && !ds.mma_chain))
      kernel1 = k_.add(codegen::emit_linear(smem ? ds : d1, ir_lines(g_, v)));
  }
  linear(kernel, dense_gemm(d, v), dl, rows_kind(g_, v), addr(n.inputs[0]),
         norm ? addr(n.inputs[1]) : LaunchArg{}, addr(n.inputs[wi]),
         d.bias ? addr(n.inputs[wi + 1]) : LaunchArg{},
         residual ? addr(n.inputs.back()) : LaunchArg{}, addr(v), false, kernel1);
}

std::pair<LaunchArg, double> Lowerer::yarn_table(ValueId v, int head_dim) {
  const ir::ref::Yarn yarn = ir::yarn_of(g_.node(v));
  std::vector<double> inv = ir::ref::yarn_inv_freq(yarn, head_dim);
  const size_t bytes = inv.size() * sizeof(double);
  return {allocate(bytes, std::move(inv)), ir::ref::yarn_attention_factor(yarn)};
}

void Lowerer::rope(ValueId v, int heads, int head_dim, LaunchArg x, LaunchArg y) {
  const auto [table, att] = yarn_table(v, head_dim);
  const codegen::RopeDims d{heads, head_dim, att};
  const int kernel = k_.add(codegen::emit_rope_yarn(d, ir_lines(g_, v)));
  emit(kernel, Rows::Tokens, 0, -1, {x, addr(g_.node(v).inputs.back()), table, y});
}

void Lowerer::lower_qkv_rope(ValueId v) {
  const Node& n = g_.node(v);
  const int head_dim = as_int(n.attr_int("head_dim"));
  const double eps = n.attr_float("eps");
  codegen::QkvDims qd;
  qd.round_act = !c_.gemm_split;
  qd.k = static_dim(g_, n.inputs[2], 1);
  qd.nq = static_dim(g_, n.inputs[2], 0);
  qd.nk = static_dim(g_, n.inputs[4], 0);
  qd.nv = static_dim(g_, n.inputs[6], 0);
  qd.eps = eps;
  // Canonical plans run no decode GEMV: their chained fused kernel (below) or the gemm path,
  // whose K order and splits do not depend on the step's rows; the rope and cache writes as
  // for a gemm step where the gemms serve.
  const bool gemm_always = canonical_gemms();
  const bool fused = codegen::qkv_decode_fits(qd) && !gemm_always;
  std::vector<DenseGemm> gemms;
  std::vector<codegen::LinearDims> dims;
  std::vector<int> gemv;
  for (int r = 0; r < 3; ++r) {
    const ValueId w = n.inputs[size_t(2 + 2 * r)];
    codegen::LinearDims d;
    d.round_act = !c_.gemm_split;
    d.norm = true;
    d.eps = eps;
    d.k = static_dim(g_, w, 1);
    d.n = static_dim(g_, w, 0);
    gemms.push_back(dense_gemm(d, v));
    gemv.push_back(fused || gemm_always ? -1 : k_.add(codegen::emit_linear(d, ir_lines(g_, v))));
    if (gemm_always)
      d.max_tokens = 0; // linear(): the gemm from one row
    dims.push_back(d);
    // The three share q's activations: in K order for cuBLAS, in slots for gemm_wg.
    if ((gemms.back().library >= 0) != (gemms.front().library >= 0))
      throw Error("lowering: q, k and v projections must all be library gemms or none");
  }
  auto projections = [&] { // one inv-rms for the three projections of the same x
    for (int r = 0; r < 3; ++r)
      linear(gemv[size_t(r)], gemms[size_t(r)], dims[size_t(r)], Rows::Tokens, addr(n.inputs[0]),
             addr(n.inputs[1]), addr(n.inputs[size_t(2 + 2 * r)]),
             addr(n.inputs[size_t(3 + 2 * r)]), LaunchArg{}, addr(v, r), r > 0);
  };
  const auto [table, att] = yarn_table(v, head_dim);
  const int hq = static_dim(g_, v, 1, 0), hk = static_dim(g_, v, 1, 1);
  const auto [kw, vw] = kv_writes_of(v);
  // Decode steps (one token per sequence) write both caches before attention: with at most 8
  // tokens in qkv_rope_decode's epilogue (no rope launch), above in rope_yarn_qk_kv. Other
  // steps rotate in rope_yarn_qk and write the caches after attention (kv_write).
  const ValueId kc = kw < 0 ? -1 : cache_node(g_.node(kw).inputs[0]);
  const ValueId vc = kw < 0 ? -1 : cache_node(g_.node(vw).inputs[0]);
  codegen::QkvDims qr = qd;
  if (kw >= 0) {
    qr.head_dim = head_dim;
    qr.block = cache_block(kc);
    qr.table = table_blocks(kc);
    qr.attention_factor = att;
    qr.f32_cache = g_.type(kc).dtype == ir::DType::F32;
  }
  // Canonical plans' decode steps: q, k, v, the rope and the cache writes in one launch that
  // sums in the gemms' order (their K splits); the gemms serve every other step.
  codegen::QkvDims qc = qr;
  qc.chain_q = c_.natural ? 1 : codegen::wg_splitk(qd.k, qd.nq);
  qc.chain_kv = c_.natural ? 1 : codegen::wg_splitk(qd.k, qd.nk);
  qc.chain_natural = c_.natural;
  const bool chain = gemm_always && kw >= 0 &&
                     (c_.natural || codegen::wg_splitk(qd.k, qd.nv) == qc.chain_kv) &&
                     codegen::qkv_chain_fits(qc);
  const bool rope_fused = (fused || chain) && kw >= 0 && (chain || codegen::qkv_decode_fits(qr));
  // The fused launches' arguments: x, ln, the weights and biases, q, k, v, the rows; with the
  // rope the positions, the sequences, the block tables, the angles and the two caches.
  auto fused_args = [&](bool with_rope) {
    std::vector<LaunchArg> args;
    for (size_t i = 0; i < 8; ++i)
      args.push_back(addr(n.inputs[i]));
    for (int r = 0; r < 3; ++r)
      args.push_back(addr(v, r));
    args.push_back(rows_arg());
    if (with_rope) {
      const Node& kn = g_.node(kw);
      for (LaunchArg a : {addr(n.inputs.back()), addr(kn.inputs[3]), addr(kn.inputs[4]), table,
                          addr(kc), addr(vc)})
        args.push_back(a);
    }
    return args;
  };
  if (chain) {
    codegen::QkvDims qc1 = qc;
    qc1.max_tokens = 1;
    const int one = k_.add(codegen::emit_qkv_rope_chain(qc1, ir_lines(g_, v)));
    const int few = k_.add(codegen::emit_qkv_rope_chain(qc, ir_lines(g_, v)));
    outer_per_seq_ = 1;
    emit(one, Rows::Tokens, 0, 1, fused_args(true));
    emit(few, Rows::Tokens, 2, kDecodeTokens, fused_args(true));
    outer_lo_ = kDecodeTokens + 1; // longer decode steps
    projections();
    outer_lo_ = 0;
    outer_per_seq_ = -1; // steps with several tokens of a sequence
    projections();
    outer_per_seq_ = 0;
  } else if (!fused) {
    projections();
  }
  if (fused) {
    const int qkv = k_.add(codegen::emit_qkv_decode(qd, ir_lines(g_, v)));
    codegen::QkvDims qd1 = qd; // one-token steps: 15.9 against 17.1 us for the 20b's qkv
    qd1.max_tokens = 1;
    std::vector<LaunchArg> args = fused_args(false);
    if (rope_fused) {
      codegen::QkvDims qr1 = qr;
      qr1.max_tokens = 1;
      const int rope1 = k_.add(codegen::emit_qkv_decode(qr1, ir_lines(g_, v)));
      // 2-8 tokens on tensor cores where they fit (sm_90, bf16 activations): the chained
      // kernel, 25.5 against 44.2 us for the 20b's qkv at 8 tokens (timeline, H100; docs/PERF.md
      // "Batch invariance"); one token stays on the FMA kernel (12.1 against 12.7 us).
      const bool mma8 = c_.wgmma && !c_.gemm_split && codegen::qkv_chain_fits(qc);
      const int rope8 = k_.add(mma8 ? codegen::emit_qkv_rope_chain(qc, ir_lines(g_, v))
                                    : codegen::emit_qkv_decode(qr, ir_lines(g_, v)));
      std::vector<LaunchArg> rargs = fused_args(true);
      outer_per_seq_ = 1;
      emit(rope1, Rows::Tokens, 0, 1, rargs);
      emit(rope8, Rows::Tokens, 2, kDecodeTokens, std::move(rargs));
      outer_per_seq_ = -1; // a few tokens of one sequence: qkv, then rope_yarn_qk
      emit(qkv, Rows::Tokens, 2, kDecodeTokens, std::move(args));
      outer_per_seq_ = 0;
    } else {
      emit(k_.add(codegen::emit_qkv_decode(qd1, ir_lines(g_, v))), Rows::Tokens, 0, 1, args);
      emit(qkv, Rows::Tokens, 2, kDecodeTokens, std::move(args));
    }
    // Steps of more than 8 tokens: the three gemm linears.
    outer_lo_ = kDecodeTokens + 1;
    for (int r = 0; r < 3; ++r)
      linear(-1, gemms[size_t(r)], dims[size_t(r)], Rows::Tokens, addr(n.inputs[0]),
             addr(n.inputs[1]), addr(n.inputs[size_t(2 + 2 * r)]),
             addr(n.inputs[size_t(3 + 2 * r)]), LaunchArg{}, addr(v, r), r > 0);
    outer_lo_ = 0;
  }
  const int rope = k_.add(codegen::emit_rope_yarn_qk(hq, hk, head_dim, att, ir_lines(g_, v)));
  if (kw < 0) {
    emit(rope, Rows::Tokens, 0, -1, {addr(v, 0), addr(v, 1), addr(n.inputs.back()), table});
    return;
  }
  const Node& kn = g_.node(kw);
  const int rope_kv =
      k_.add(codegen::emit_rope_yarn_qk_kv(hq, hk, head_dim, att, cache_block(kc), table_blocks(kc),
                                           g_.type(kc).dtype == ir::DType::F32, ir_lines(g_, v)));
  outer_per_seq_ = -1;
  emit(rope, Rows::Tokens, 0, -1, {addr(v, 0), addr(v, 1), addr(n.inputs.back()), table});
  outer_per_seq_ = 1;
  emit(rope_kv, Rows::Tokens, rope_fused ? kDecodeTokens + 1 : 0, -1,
       {addr(v, 0), addr(v, 1), addr(v, 2), addr(n.inputs.back()), addr(kn.inputs[3]),
        addr(kn.inputs[4]), table, addr(kc), addr(vc)});
  outer_per_seq_ = 0;
  kv_in_rope_.insert(kw);
  kv_in_rope_.insert(vw);
}

std::pair<ValueId, ValueId> Lowerer::kv_writes_of(ValueId v) const {
  if (!kv_writes_indexed_) { // one pass over the graph (a scan per rope was quadratic in layers)
    for (ValueId u = 0; u < static_cast<ValueId>(g_.size()); ++u) {
      const Node& w = g_.node(u);
      if (w.op == Op::KvWrite && g_.node(w.inputs[1]).op == Op::Extract)
        kv_writes_by_source_[g_.node(w.inputs[1]).inputs[0]].push_back(u);
    }
    kv_writes_indexed_ = true;
  }
  const ValueId positions = g_.node(v).inputs.back();
  ValueId found[3] = {-1, -1, -1};
  const auto users = kv_writes_by_source_.find(v);
  for (ValueId u : users == kv_writes_by_source_.end() ? std::vector<ValueId>{} : users->second) {
    const Node& w = g_.node(u);
    if (u <= v || w.inputs[2] != positions)
      continue;
    const Node& x = g_.node(w.inputs[1]);
    const int64_t r = x.attr_int("index");
    if (r < 1 || r > 2 || found[r] >= 0)
      return {-1, -1};
    found[r] = u;
  }
  if (found[1] < 0 || found[2] < 0)
    return {-1, -1};
  const Node &kn = g_.node(found[1]), &vn = g_.node(found[2]);
  const ValueId kc = cache_node(kn.inputs[0]), vc = cache_node(vn.inputs[0]);
  if (g_.type(kc) != g_.type(vc) || kn.inputs[3] != vn.inputs[3] || kn.inputs[4] != vn.inputs[4])
    return {-1, -1};
  return {found[1], found[2]};
}

ValueId Lowerer::cache_node(ValueId v) const {
  while (g_.node(v).op == Op::KvWrite)
    v = g_.node(v).inputs[0];
  XSERV_CHECK(g_.node(v).op == Op::Cache, "cache operand is not a cache: " + ir::print_node(g_, v));
  return v;
}

int Lowerer::cache_block(ValueId cache) const {
  const ir::Dim& d = g_.type(cache).shape.at(1);
  XSERV_CHECK(d.is_static() && d.size > 0,
              "a cache without a static block size: " + ir::print_node(g_, cache));
  return as_int(d.size);
}

int Lowerer::table_blocks(ValueId cache) const {
  const int64_t block = cache_block(cache);
  return as_int((c_.max_seq + block - 1) / block);
}

void Lowerer::lower_attention(ValueId v) {
  const Node& n = g_.node(v);
  const ValueId kc = cache_node(n.inputs[3]);
  codegen::AttentionDims d;
  d.heads = static_dim(g_, v, 1);
  d.head_dim = static_dim(g_, v, 2);
  d.kv_heads = static_dim(g_, n.inputs[1], 1);
  d.block = cache_block(kc);
  d.table = table_blocks(kc);
  d.window = as_int(n.attr_int("window"));
  d.scale = n.attr_float("scale");
  d.f32_cache = g_.type(kc).dtype == ir::DType::F32;
  std::vector<LaunchArg> in;
  for (size_t i = 0; i < 10; ++i)
    in.push_back(i == 3 || i == 4 ? addr(cache_node(n.inputs[i])) : addr(n.inputs[i]));
  const LaunchArg out = addr(v);
  const int window = std::max(0, d.window);
  if (canonical_attention(d)) {
    // Every step in the canonical order of attention_mma.cuh (key tiles and chunks at fixed
    // positions), so that a token's attention is the same bits in any step: the prompt kernel
    // above kSplitTokens tokens, the decode kernel below and for decode steps of any size (one
    // token a sequence: the prompt kernel's query tiles would hold one token a sequence), its
    // chunks folded by the combine when they went to blocks of their own. Split plans give the
    // kernels every operand as an fp16 pair (fp32-grade products).
    d.chunk = runtime::kAttnChunkKeys;
    d.split = c_.gemm_split;
    const int dec = k_.add(codegen::emit_attention_decode_mma(d, ir_lines(g_, v)));
    const int pre = k_.add(codegen::emit_attention_prefill_mma(d, ir_lines(g_, v)));
    const int comb = k_.add(codegen::emit_attention_combine_chunks(
        d, {"folds the key chunks of attention(...) for any window and scale"}));
    std::vector<LaunchArg> dec_args = in;
    for (const LaunchArg& a : {out, part_ml_, part_o_})
      dec_args.push_back(a);
    const std::vector<LaunchArg> comb_args = {part_ml_, part_o_, in[5], splits_arg(), out};
    split_chunk_ = d.chunk;
    emit(dec, Rows::Tokens, 0, kSplitTokens, dec_args, 0, window, 1, d.kv_heads);
    emit(comb, Rows::Tokens, 0, kSplitTokens, comb_args, 0, window, 2, d.kv_heads);
    if (c_.max_tokens > kSplitTokens) {
      int dec_many = dec; // the same bits in many_token_decode_warps warps
      if (c_.many_token_decode_warps > 0) {
        codegen::AttentionDims dm = d;
        dm.decode_warps = c_.many_token_decode_warps;
        dec_many = k_.add(codegen::emit_attention_decode_mma(dm, ir_lines(g_, v)));
      }
      outer_per_seq_ = 1; // each block all its token's chunks (the combine serves up to 64)
      emit(dec_many, Rows::Tokens, kSplitTokens + 1, -1, dec_args);
      // Steps mixing decodes (first) and prompt chunks: the decode kernel over the decodes, as
      // in a step of them alone, and the prompt kernel over the chunks' rows, its per-token
      // pointers advanced past the decodes. In the prompt kernel a decode would be a segment
      // of a 16-token query tile walked after the tile's other sequences (H100, 64 decodes at
      // depth 512 with a 64-token chunk: 440 us a full layer against 60 for 64 decodes alone).
      outer_per_seq_ = -1;
      part_ = 1;
      emit(dec_many, Rows::Tokens, kSplitTokens + 1, -1, dec_args, 0, window, 1, d.kv_heads);
      emit(comb, Rows::Tokens, kSplitTokens + 1, -1, comb_args, 0, window, 2, d.kv_heads);
      part_ = 2;
      const uint64_t q_row = uint64_t(d.heads) * d.head_dim * sizeof(float),
                     kv_row = uint64_t(d.kv_heads) * d.head_dim * sizeof(float);
      std::vector<LaunchArg> pre_args = in; // q, k, v, positions, token_seq: the step's rows
      for (size_t i : {0, 1, 2, 6, 7})
        pre_args[i] = strided(in[i], i == 0 ? q_row : i < 6 ? kv_row : sizeof(int32_t));
      pre_args.push_back(strided(out, q_row));
      pre_args.push_back(rows_arg());
      emit(pre, Rows::Tokens, kSplitTokens + 1, -1, std::move(pre_args));
      part_ = 0;
      outer_per_seq_ = 0;
    }
    split_chunk_ = 0;
    return;
  }
  // Head groups the tensor-core tiles do not fit (no gpt-oss model): the fp32 decode kernel
  // for every step, split over keys for steps of up to kSplitTokens tokens (the executor's
  // rule, runtime::attention_step_splits; window 0: none); a split past a token's keys stays
  // empty.
  const int dec = k_.add(codegen::emit_attention_decode(d, ir_lines(g_, v)));
  // The combine step depends only on heads and head_dim: one generic header for every node.
  const int comb = k_.add(codegen::emit_attention_combine(
      d, {"merges the key splits of attention(...) for any window and scale"}));
  std::vector<LaunchArg> dec_args = in;
  for (const LaunchArg& a : {out, part_ml_, part_o_})
    dec_args.push_back(a);
  emit(dec, Rows::Tokens, 0, kSplitTokens, dec_args, 0, window, 1, d.kv_heads);
  emit(dec, Rows::Tokens, kSplitTokens + 1, -1, dec_args);
  emit(comb, Rows::Tokens, 0, kSplitTokens, {part_ml_, part_o_, in[5], splits_arg(), out}, 0,
       window, 2, d.kv_heads);
}

void Lowerer::lower_kv_write(ValueId v) {
  const Node& n = g_.node(v);
  const ValueId cache = cache_node(n.inputs[0]);
  const codegen::KvWriteDims d{static_dim(g_, n.inputs[1], 1),
                               static_dim(g_, n.inputs[1], 2),
                               cache_block(cache),
                               table_blocks(cache),
                               as_int(n.has_attr("window") ? n.attr_int("window") : 0),
                               g_.type(cache).dtype == ir::DType::F32};
  const int kernel = k_.add(codegen::emit_kv_write(d, ir_lines(g_, v)));
  // In decode steps rope_yarn_qk_kv already wrote this one (kv_in_rope_).
  outer_per_seq_ = kv_in_rope_.count(v) ? -1 : 0;
  emit(kernel, Rows::Tokens, 0, -1,
       {addr(cache), addr(n.inputs[1]), addr(n.inputs[2]), addr(n.inputs[3]), addr(n.inputs[4])});
  outer_per_seq_ = 0;
}

void Lowerer::topk(ValueId v, int experts, int k, LaunchArg logits) {
  const int kernel = k_.add(codegen::emit_router_topk({experts, k}, ir_lines(g_, v)));
  emit(kernel, Rows::Tokens, 0, -1, {logits, addr(v, 0), addr(v, 1)});
}

void Lowerer::lower_router(ValueId v) {
  const Node& n = g_.node(v);
  codegen::LinearDims d;
  d.round_act = !c_.gemm_split;
  d.k = static_dim(g_, n.inputs[1], 1);
  d.n = static_dim(g_, n.inputs[1], 0);
  d.bias = n.inputs.size() == 3;
  const int k = as_int(n.attr_int("k"));
  const ValueId norm = n.inputs[0];
  const bool fused_decode = router_of_norm(norm) == v;
  if (fused_decode) {
    // Decode steps: the norm before the router, the router's logits and top-k in one launch
    // (writing the norm's output for the experts too); longer steps as below.
    // Canonical plans: in the canonical order, the logits the gemm path below gives.
    const Node& nn = g_.node(norm);
    const codegen::RouterTopKDims rd = router_dims(d.k, d.n, k);
    const int fused =
        k_.add(rd.chain > 0 ? codegen::emit_norm_router_topk_chain(d.k, rd, nn.attr_float("eps"),
                                                                   d.bias, ir_lines(g_, v))
                            : codegen::emit_norm_router_topk(d.k, rd, nn.attr_float("eps"), d.bias,
                                                             ir_lines(g_, v)));
    std::vector<LaunchArg> args = {addr(nn.inputs[0]), addr(nn.inputs[1]), addr(n.inputs[1])};
    if (d.bias)
      args.push_back(addr(n.inputs[2]));
    for (const LaunchArg& a : {addr(norm), addr(v, 0), addr(v, 1)})
      args.push_back(a);
    emit(fused, Rows::Tokens, 0, kDecodeTokens, std::move(args));
    outer_lo_ = kDecodeTokens + 1;
  }
  // The router's own GEMV serves what the fused launch does not: every step when there is no
  // fused launch, the longer ones when no gemm takes them.
  const bool gemm_always = canonical_gemms(); // canonical plans: the gemm wherever the
                                              // chained fused launch does not serve
  const bool gemv_used =
      !gemm_always && (!fused_decode || !(gemm_path() && codegen::gemm_fits(d.k)));
  const int kernel = gemv_used ? k_.add(codegen::emit_linear(d, ir_lines(g_, v))) : -1;
  if (gemm_always)
    d.max_tokens = 0;
  // The router's gemm on cuBLAS too in the natural order (no split K for gemm_wg's small tiles).
  linear(kernel, dense_gemm(d, v, c_.natural), d, Rows::Tokens, addr(n.inputs[0]), LaunchArg{},
         addr(n.inputs[1]), d.bias ? addr(n.inputs[2]) : LaunchArg{}, LaunchArg{}, router_logits_);
  // The MoE after this router reads the same x: its gate_up takes these activations (not in the
  // natural order: the experts' gemms take gemm_wg's slots).
  wg_act_valid_ = c_.wgmma && !c_.natural;
  topk(v, d.n, k, router_logits_);
  outer_lo_ = 0;
}

codegen::RouterTopKDims Lowerer::router_dims(int dim, int experts, int k) const {
  codegen::RouterTopKDims rd{experts, k, !c_.gemm_split};
  if (canonical_gemms()) { // the router gemm's K split (dense_gemm_wg), or one natural chain
    rd.chain = c_.natural ? 1 : codegen::wg_splitk(dim, experts);
    rd.chain_natural = c_.natural;
  }
  return rd;
}

ValueId Lowerer::router_of_norm(ValueId norm) const {
  if (g_.node(norm).op != Op::RmsNorm || rows_kind(g_, norm) != Rows::Tokens)
    return -1;
  for (ValueId u = norm + 1; u < static_cast<ValueId>(g_.size()); ++u) {
    const Node& r = g_.node(u);
    if (r.op != Op::Router || r.inputs[0] != norm)
      continue;
    const int experts = static_dim(g_, r.inputs[1], 0), dim = static_dim(g_, r.inputs[1], 1);
    const codegen::RouterTopKDims rd = router_dims(dim, experts, as_int(r.attr_int("k")));
    const bool fits = rd.chain > 0 ? codegen::norm_router_topk_chain_fits(dim, rd)
                                   : !canonical_gemms() && codegen::norm_router_topk_fits(dim, rd);
    return fits ? u : -1;
  }
  return -1;
}

void Lowerer::lower_moe(ValueId v) {
  const Node& n = g_.node(v);
  codegen::MoeDims d;
  d.round_act = !c_.gemm_split;
  d.experts = static_dim(g_, n.inputs[3], 0);
  d.hidden = static_dim(g_, n.inputs[3], 2);
  d.inter = static_dim(g_, n.inputs[5], 2);
  d.k = static_dim(g_, n.inputs[1], 1);
  d.residual = n.op == Op::MoeExpertsResidual;
  d.limit = n.attr_float("limit");
  d.alpha = n.attr_float("alpha");
  // MXFP4 on the device: the decode kernels read it (Both: its copy); the gemms only when
  // there is no BF16 copy.
  d.mxfp4 = c_.expert_format != runtime::ExpertFormat::Bf16;
  const bool both = c_.expert_format == runtime::ExpertFormat::Both;
  // Decode steps on tensor cores where they fit (MXFP4, plain bf16 activations; sm_90 plans, the
  // architecture they are measured on): mma.sync per 16 rows and block, the weights through a
  // shared tile where the sizes allow, else straight into registers (docs/PERF.md, "Kernel
  // figures").
  // With --gemm-order canonical, in the canonical order where it fits (gemm_wg's K order and
  // one chain a row: a token's expert rows are the same bits in a decode step as in the grouped
  // gemms of a larger one; docs/DESIGN.md, "The gemms' canonical order").
  if (c_.wgmma) {
    d.mma = true;
    d.mma_chain = c_.canonical;
    d.mma_stages = codegen::kMoeMmaStages; // the canonical order on a shared ring,
    if (!codegen::moe_mma_fits(d))
      d.mma_chain = false; // else the block sums in a ring where the sizes allow,
    if (!codegen::moe_mma_fits(d))
      d.mma_stages = 0;               // else the words straight into registers,
    d.mma = codegen::moe_mma_fits(d); // else the FMA kernels
  }
  const int gu = k_.add(codegen::emit_moe_gate_up(d, ir_lines(g_, v)));
  // Decode: gate_up + SwiGLU per (token, slot), the down rows per (token, slot), combine.
  const int dn = k_.add(codegen::emit_moe_down_part(d, ir_lines(g_, v)));
  // Steps of 2 to 8 tokens: an expert a block and the tokens as the MMA's columns (each expert
  // read once a step, not once a pair; the same bits), where they fit.
  codegen::MoeDims dc = d;
  dc.mma_cols = true;
  const bool cols = c_.moe_cols && codegen::moe_cols_fits(dc);
  const int gu_cols = cols ? k_.add(codegen::emit_moe_gate_up(dc, ir_lines(g_, v))) : -1;
  const int dn_cols = cols ? k_.add(codegen::emit_moe_down_part(dc, ir_lines(g_, v))) : -1;
  const int combine = k_.add(codegen::emit_moe_combine(d.hidden, d.k, d.residual, ir_lines(g_, v)));
  std::vector<LaunchArg> in;
  for (ValueId i : n.inputs)
    in.push_back(addr(i));
  const LaunchArg act = moe_act_, y = addr(v), null;
  // Many tokens: sort the (token, slot) pairs by expert, one grouped gemm per matrix (gate_up
  // with the SwiGLU epilogue, down scattering weighted rows), and a deterministic combine.
  bool use_gemm = false;
  if (gemm_path() && c_.wgmma && codegen::gemm_fits(d.hidden) && codegen::gemm_fits(d.inter)) {
    for (int i = 0; i < int(kWgMoeTilings.size()); ++i) {
      // The tiling is the one wg_moe_tiling picks: the tokens (above 8) that pick it.
      int lo = -1, hi = -1;
      for (int t = kDecodeTokens + 1; t <= c_.max_tokens; ++t)
        if (wg_moe_tiling(t, d.k, d.experts) == i) {
          lo = lo < 0 ? t : lo;
          hi = t;
        }
      if (lo >= 0)
        moe_gemms_wg(v, d, i, lo, hi, in);
    }
    use_gemm = true;
  } else if (gemm_path() && codegen::gemm_fits(d.hidden) && codegen::gemm_fits(d.inter)) {
    for (size_t i = 0; i < 3; ++i) {
      const int bm = kMoeTileRows[i];
      codegen::MoeSortDims sd{d.experts, d.k, bm, c_.max_tokens * d.k};
      const int sort = k_.add(
          codegen::emit_moe_sort(sd, {"groups moe_experts(...)'s (token, slot) pairs by expert"}));
      codegen::GemmDims gd;
      gd.grouped = true;
      gd.experts = d.experts;
      gd.ksel = d.k;
      gd.bm = bm;
      gd.split = c_.gemm_split;
      gd.k = d.hidden;
      gd.n = 2 * d.inter;
      gd.gather = true;
      gd.epilogue = codegen::GemmEpilogue::Swiglu;
      gd.limit = d.limit;
      gd.alpha = d.alpha;
      gd.mxfp4 = d.mxfp4 && !both;
      const int gate_up = k_.add(codegen::emit_gemm(gd, ir_lines(g_, v)));
      gd.k = d.inter;
      gd.n = d.hidden;
      gd.gather = false;
      gd.epilogue = codegen::GemmEpilogue::Scatter;
      const int down = k_.add(codegen::emit_gemm(gd, ir_lines(g_, v)));
      // The tile is the one moe_tile_index picks: the tokens (above 8) that pick it.
      int lo = -1, hi = -1;
      for (int t = kDecodeTokens + 1; t <= c_.max_tokens; ++t)
        if (moe_tile_index(t, d.k, d.experts) == int(i)) {
          lo = lo < 0 ? t : lo;
          hi = t;
        }
      if (lo < 0)
        continue;
      emit(sort, Rows::Tokens, lo, hi, {in[2], moe_pair_, moe_tiles_, rows_arg()});
      emit(gate_up, Rows::Tokens, lo, hi,
           {in[0], null, null, in[3], in[4], null, act, moe_pair_, moe_tiles_, null, rows_arg()});
      emit(down, Rows::Tokens, lo, hi,
           {act, null, null, in[5], in[6], null, moe_part_, moe_pair_, moe_tiles_, in[1],
            rows_arg()});
    }
    use_gemm = true;
  }
  const int dec_hi = use_gemm ? kDecodeTokens : -1;
  // Both: the decode kernels read the MXFP4 copies (the gemms above take the BF16 tensors).
  auto copy = [&](LaunchArg a) {
    if (both)
      a.name = runtime::mxfp4_copy_name(a.name);
    return a;
  };
  const std::vector<LaunchArg> gu_args = {in[0], in[2], copy(in[3]), in[4], act};
  const std::vector<LaunchArg> dn_args = {act, in[1], in[2], copy(in[5]), in[6], moe_part_};
  if (cols && (dec_hi > 0 ? dec_hi : c_.max_tokens) <= kDecodeTokens) {
    emit(gu, Rows::Tokens, 0, kMoeColsFrom - 1, gu_args);
    emit(dn, Rows::Tokens, 0, kMoeColsFrom - 1, dn_args);
    emit(gu_cols, Rows::Tokens, kMoeColsFrom, dec_hi, gu_args);
    emit(dn_cols, Rows::Tokens, kMoeColsFrom, dec_hi, dn_args);
  } else {
    emit(gu, Rows::Tokens, 0, dec_hi, gu_args);
    emit(dn, Rows::Tokens, 0, dec_hi, dn_args);
  }
  if (d.residual)
    emit(combine, Rows::Tokens, 0, -1, {moe_part_, in[7], y});
  else
    emit(combine, Rows::Tokens, 0, -1, {moe_part_, y});
}

} // namespace xserv::codegen::lowering
