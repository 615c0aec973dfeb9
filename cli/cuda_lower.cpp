// Node-by-node lowering of the fused graph to the codegen kernels and a launch table.
//
// Every node gets the kernels of both paths and launch table entries whose row ranges pick by
// the step's size (docs/DESIGN.md, kernel selection): decode GEMVs for at most 8 rows,
// tensor-core gemms (split K up to 64 rows) above, grouped expert gemms for the MoE, query-tiled
// attention above 64 tokens. The engine captures decode launches as CUDA graphs, which is why
// launches depend on the step only through its sizes (tokens, sequences, attention key bucket).
#include "cli/cuda_lower.h"

#include <algorithm>
#include <array>
#include <regex>
#include <set>

#include <fmt/format.h>

#include "codegen/emit_prefill.h"
#include "ir/error.h"
#include "ir/interpreter.h"
#include "ir/reference.h"

namespace xserv::cli {

namespace {

using ir::Node;
using ir::Op;
using ir::ValueId;
using runtime::LaunchArg;
using Kind = runtime::LaunchArg::Kind;

int as_int(int64_t v) {
  return static_cast<int>(v);
}

/// Static size of dim `i` of value `v`'s result `r` (throws for a dynamic one).
int static_dim(const ir::Graph& g, ValueId v, size_t i, int r = 0) {
  const ir::Dim& d = g.node(v).types.at(static_cast<size_t>(r)).shape.at(i);
  XSERV_CHECK(d.name.empty(), fmt::format("expected a static dim: {}", ir::print_node(g, v)));
  return as_int(d.size);
}

/// Which grid rows a value's leading dims stand for: the step's tokens (T) or sequences (B).
enum class Rows { Tokens, Seqs };

Rows rows_kind(const ir::Graph& g, ValueId v) {
  const ir::Dim& d = g.type(v).shape.at(0);
  if (d.name == "B")
    return Rows::Seqs;
  XSERV_CHECK(d.name == "T",
              fmt::format("expected a T or B leading dim: {}", ir::print_node(g, v)));
  return Rows::Tokens;
}

/// The IR line a kernel's source is headed by: the node with its value numbers blanked, so
/// that every node a kernel serves gives the same source (and one cache entry).
std::vector<std::string> ir_lines(const ir::Graph& g, ValueId v) {
  return {std::regex_replace(ir::print_node(g, v), std::regex("%[0-9]+"), "%_")};
}

/// Int arguments: the launch's rows, its key splits.
LaunchArg rows_arg() {
  LaunchArg a;
  a.kind = Kind::Rows;
  return a;
}
LaunchArg splits_arg() {
  LaunchArg a;
  a.kind = Kind::Splits;
  return a;
}

/// `a` advanced by `bytes` per row of a chunk's start (null stays null).
LaunchArg strided(LaunchArg a, uint64_t bytes) {
  if (a.kind != Kind::Null)
    a.row_stride = bytes;
  return a;
}

/// The most tokens the decode kernels take in one launch (linear_decode's MAX_T).
constexpr int kDecodeTokens = 8;
/// Attention splits over keys only in steps of at most this many tokens.
constexpr int kSplitTokens = 64;
/// Dense gemms of at most this many rows split K over blocks (few row tiles would leave most
/// SMs idle).
constexpr int kSmallGemmRows = 64;
/// Row tiles of the grouped MoE gemms, chosen by the rows each expert gets.
constexpr std::array<int, 3> kMoeTileRows = {32, 64, 128};

/// Lowers one graph into a launch table; holds the per-graph scratch buffers.
class Lowerer {
public:
  Lowerer(const ir::Graph& g, KernelSet& k, const LoweringContext& c) : g_(g), k_(k), c_(c) {
    XSERV_CHECK(c_.memory, "lower_graph needs the activation memory plan");
    for (ValueId v = 0; v < static_cast<ValueId>(g_.size()); ++v)
      if (g_.node(v).op == Op::Cache)
        cache_index_.emplace(v, int(cache_index_.size()));
  }

  runtime::LaunchTable run() {
    allocate_scratch();
    for (ValueId v = 0; v < static_cast<ValueId>(g_.size()); ++v) {
      label_ = std::string(ir::op_name(g_.node(v).op)); // profiles group launches by op
      lower(v);
    }
    label_ = "argmax";
    lower_sampling();
    t_.kernels = k_.plan_kernels();
    return std::move(t_);
  }

private:
  /// The argument for result `r` of value `v`: step inputs by name, weights by name, caches by
  /// index, everything else at its offset in the activation arena.
  LaunchArg addr(ValueId v, int r = 0) const {
    const Node& n = g_.node(v);
    LaunchArg a;
    switch (n.op) {
    case Op::Param:
      a.kind = Kind::Param;
      a.name = n.attr_str("name");
      return a;
    case Op::Weight:
      a.kind = Kind::Weight;
      a.name = n.attr_str("name");
      return a;
    case Op::Cache:
      a.kind = Kind::Cache;
      a.index = cache_index_.at(v);
      return a;
    case Op::KvWrite:
      return addr(n.inputs[0], 0);
    default: {
      const compiler::MemoryPlan& m = *c_.memory;
      const int32_t b = m.buffer_of.at(static_cast<size_t>(v)).at(static_cast<size_t>(r));
      XSERV_CHECK(b >= 0, "value without a buffer: " + ir::print_node(g_, v));
      a.kind = Kind::Activation;
      a.offset = static_cast<uint64_t>(m.buffers.at(static_cast<size_t>(b)).offset);
      return a;
    }
    }
  }

  /// A scratch buffer of `bytes` that lives as long as the engine, holding `f64` if given.
  LaunchArg allocate(size_t bytes, std::vector<double> f64 = {}) {
    t_.scratch.push_back({bytes, std::move(f64)});
    LaunchArg a;
    a.kind = Kind::Scratch;
    a.index = int(t_.scratch.size() - 1);
    return a;
  }

  /// Appends a table entry launching `kernel` when the step's rows lie in [lo, hi] (hi -1:
  /// unbounded) and within outer_. Entries no step within capacity reaches are left out.
  void emit(int kernel, Rows rows, int lo, int hi, std::vector<LaunchArg> args, int chunk = 0,
            int splits_window = -1, int min_splits = 1) {
    runtime::PlanLaunch l;
    l.kernel = kernel;
    l.label = label_;
    l.seq_rows = rows == Rows::Seqs;
    l.min_rows = std::max(lo, outer_lo_);
    l.max_rows = outer_hi_ < 0 ? hi : hi < 0 ? outer_hi_ : std::min(hi, outer_hi_);
    const int capacity = rows == Rows::Tokens ? c_.max_tokens : c_.max_seqs;
    if ((l.max_rows >= 0 && l.min_rows > l.max_rows) || l.min_rows > capacity)
      return;
    if (kernel < 0)
      throw Error(fmt::format("the CUDA engine has no kernel for {} steps of {} to {} rows", label_,
                              l.min_rows, l.max_rows));
    l.chunk = chunk;
    l.splits_window = splits_window;
    l.min_splits = min_splits;
    l.one_per_seq = outer_per_seq_;
    l.args = std::move(args);
    t_.launches.push_back(std::move(l));
  }

  void allocate_scratch() {
    size_t attn = 0, router = 0, act = 0;
    for (ValueId v = 0; v < static_cast<ValueId>(g_.size()); ++v) {
      const Node& n = g_.node(v);
      if (n.op == Op::Attention)
        attn = std::max<size_t>(attn, size_t(static_dim(g_, v, 1)) * static_dim(g_, v, 2));
      if (n.op == Op::Router)
        router = std::max<size_t>(router, size_t(static_dim(g_, n.inputs[1], 0)));
      if (n.op == Op::MoeExperts || n.op == Op::MoeExpertsResidual)
        act = std::max<size_t>(act, size_t(static_dim(g_, n.inputs[1], 1)) *
                                        static_dim(g_, n.inputs[5], 2));
    }
    const size_t t = static_cast<size_t>(c_.max_tokens), splits = 32;
    if (attn) {
      // Key splits only for steps of at most kSplitTokens tokens (see lower_attention).
      const size_t ts = std::min<size_t>(t, kSplitTokens);
      part_o_ = allocate(ts * attn * splits * sizeof(float));
      part_ml_ = allocate(ts * attn * splits * 2 * sizeof(float)); // per head: <= D
    }
    if (router)
      router_logits_ = allocate(t * router * sizeof(float));
    if (act)
      moe_act_ = allocate(t * act * sizeof(float));
    size_t hidden = 0, pairs = 0, experts = 0, width = 0;
    for (ValueId v = 0; v < static_cast<ValueId>(g_.size()); ++v) {
      const Node& n = g_.node(v);
      if (n.op == Op::MoeExperts || n.op == Op::MoeExpertsResidual) {
        hidden = std::max<size_t>(hidden, size_t(static_dim(g_, n.inputs[3], 2)));
        pairs = std::max<size_t>(pairs, t * size_t(static_dim(g_, n.inputs[1], 1)));
        experts = std::max<size_t>(experts, size_t(static_dim(g_, n.inputs[3], 0)));
      }
      if (n.op == Op::RmsNormLinear || n.op == Op::QkvRope)
        width = 1;
    }
    if (pairs) // each (token, slot) pair's weighted expert row, summed by moe_combine
      moe_part_ = allocate(pairs * hidden * sizeof(float));
    if (!gemm_path())
      return;
    if (width)
      inv_rms_ = allocate(t * sizeof(float));
    if (pairs) {
      moe_pair_ = allocate(pairs * sizeof(int));
      moe_tiles_ = allocate(codegen::moe_tiles_ints(int(pairs), int(experts), kMoeTileRows[0]) *
                            sizeof(int));
    }
  }

  /// Steps of more tokens than the decode kernels take use the tensor-core gemm kernels.
  bool gemm_path() const { return c_.max_tokens > kDecodeTokens; }

  /// Row tile of a grouped gemm: about the rows one expert gets, tokens * k / experts.
  static int moe_tile_index(int tokens, int k, int experts) {
    const int per_expert = tokens * k / std::max(1, experts);
    return per_expert <= 24 ? 0 : per_expert <= 80 ? 1 : 2;
  }

  /// The gemm kernels that serve linear `d` on steps of more than 8 rows: for at most
  /// kSmallGemmRows rows split-K kernels (row tiles 32 and 64) and their reduce, else row tile
  /// 64 over all of K; for a normed linear the inv-rms prologue.
  struct DenseGemm {
    int small32 = -1, small64 = -1, large = -1, reduce = -1, inv = -1;
    int splitk = 1;
    LaunchArg part; ///< [splitk, kSmallGemmRows, n] fp32 partial sums
  };

  DenseGemm dense_gemm(const codegen::LinearDims& d, ValueId v) {
    DenseGemm k;
    if (!gemm_path() || !codegen::gemm_fits(d.k))
      return k; // steps of many tokens run the decode GEMV 8 tokens at a time
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
    if (k.splitk > 1) { // raw partial sums; bias and residual come in the reduce
      gd.bias = gd.residual = false;
      k.reduce = k_.add(codegen::emit_gemm_splitk_reduce(d.n, k.splitk, d.bias, d.residual,
                                                         {"sums the split-K partials of a gemm"}));
      const size_t bytes = size_t(k.splitk) * kSmallGemmRows * size_t(d.n) * sizeof(float);
      if (bytes > splitk_bytes_) {
        splitk_part_ = allocate(bytes);
        splitk_bytes_ = bytes;
      }
      k.part = splitk_part_;
    }
    gd.bm = 32;
    k.small32 = k_.add(codegen::emit_gemm(gd, ir_lines(g_, v)));
    gd.bm = 64;
    k.small64 = k_.add(codegen::emit_gemm(gd, ir_lines(g_, v)));
    if (d.norm)
      k.inv = k_.add(codegen::emit_row_inv_rms(
          d.k, d.eps, {"1 / rms of each row: the prologue of a normed gemm"}));
    return k;
  }

  /// Launches a linear over `rows` of x: one decode GEMV launch per 8 rows (chunks) for at
  /// most 8 rows or when no gemm fits, else the tensor-core gemm (after the rows' inv-rms,
  /// unless `inv_ready`: an earlier launch of this step computed it for the same x).
  void linear(int kernel, const DenseGemm& gemm, const codegen::LinearDims& d, Rows rows,
              LaunchArg x, LaunchArg ln, LaunchArg w, LaunchArg b, LaunchArg h, LaunchArg y,
              bool inv_ready = false, int kernel1 = -1) {
    const LaunchArg null;
    if (gemm.large >= 0) {
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
    emit(kernel, rows, kernel1 >= 0 ? 2 : 0, gemm.large >= 0 ? d.max_tokens : -1, std::move(args),
         d.max_tokens);
  }

  void lower_linear(ValueId v) {
    const Node& n = g_.node(v);
    codegen::LinearDims d;
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
    const int kernel = k_.add(codegen::emit_linear(d, ir_lines(g_, v)));
    // The attention output projection of a one-token step: a 1-token kernel with 8 loads in
    // flight per lane (13.2 against 15.1 us for the 20b's o_proj in the bandwidth test).
    int kernel1 = -1;
    if (residual) {
      codegen::LinearDims d1 = d;
      d1.max_tokens = 1;
      d1.unroll = 8;
      kernel1 = k_.add(codegen::emit_linear(d1, ir_lines(g_, v)));
    }
    linear(kernel, dense_gemm(d, v), d, rows_kind(g_, v), addr(n.inputs[0]),
           norm ? addr(n.inputs[1]) : LaunchArg{}, addr(n.inputs[wi]),
           d.bias ? addr(n.inputs[wi + 1]) : LaunchArg{},
           residual ? addr(n.inputs.back()) : LaunchArg{}, addr(v), false, kernel1);
  }

  /// The YaRN table (float64 inv_freq, a constant scratch buffer) and attention factor of a
  /// rope node.
  std::pair<LaunchArg, double> yarn_table(ValueId v, int head_dim) {
    const ir::ref::Yarn yarn = ir::yarn_of(g_.node(v));
    std::vector<double> inv = ir::ref::yarn_inv_freq(yarn, head_dim);
    const size_t bytes = inv.size() * sizeof(double);
    return {allocate(bytes, std::move(inv)), ir::ref::yarn_attention_factor(yarn)};
  }

  /// rope_yarn of [T, heads, head_dim] from `x` into `y` (may alias), the node's YaRN attributes.
  void rope(ValueId v, int heads, int head_dim, LaunchArg x, LaunchArg y) {
    const auto [table, att] = yarn_table(v, head_dim);
    const codegen::RopeDims d{heads, head_dim, att};
    const int kernel = k_.add(codegen::emit_rope_yarn(d, ir_lines(g_, v)));
    emit(kernel, Rows::Tokens, 0, -1, {x, addr(g_.node(v).inputs.back()), table, y});
  }

  /// qkv_rope: for at most 8 tokens one qkv_decode launch (the norm staged once, q, k and v
  /// rows in one grid), else three gemms after one inv-rms; then q and k rotate in place in one
  /// launch.
  void lower_qkv_rope(ValueId v) {
    const Node& n = g_.node(v);
    const int head_dim = as_int(n.attr_int("head_dim"));
    const double eps = n.attr_float("eps");
    codegen::QkvDims qd;
    qd.k = static_dim(g_, n.inputs[2], 1);
    qd.nq = static_dim(g_, n.inputs[2], 0);
    qd.nk = static_dim(g_, n.inputs[4], 0);
    qd.nv = static_dim(g_, n.inputs[6], 0);
    qd.eps = eps;
    const bool fused = codegen::qkv_decode_fits(qd);
    std::vector<DenseGemm> gemms;
    std::vector<codegen::LinearDims> dims;
    std::vector<int> gemv;
    for (int r = 0; r < 3; ++r) {
      const ValueId w = n.inputs[size_t(2 + 2 * r)];
      codegen::LinearDims d;
      d.norm = true;
      d.eps = eps;
      d.k = static_dim(g_, w, 1);
      d.n = static_dim(g_, w, 0);
      dims.push_back(d);
      gemms.push_back(dense_gemm(d, v));
      gemv.push_back(fused ? -1 : k_.add(codegen::emit_linear(d, ir_lines(g_, v))));
    }
    if (!fused) {
      for (int r = 0; r < 3; ++r) // one inv-rms for the three projections of the same x
        linear(gemv[size_t(r)], gemms[size_t(r)], dims[size_t(r)], Rows::Tokens, addr(n.inputs[0]),
               addr(n.inputs[1]), addr(n.inputs[size_t(2 + 2 * r)]),
               addr(n.inputs[size_t(3 + 2 * r)]), LaunchArg{}, addr(v, r), r > 0);
    } else {
      const int qkv = k_.add(codegen::emit_qkv_decode(qd, ir_lines(g_, v)));
      codegen::QkvDims qd1 = qd; // one-token steps: 15.9 against 17.1 us for the 20b's qkv
      qd1.max_tokens = 1;
      const int qkv1 = k_.add(codegen::emit_qkv_decode(qd1, ir_lines(g_, v)));
      std::vector<LaunchArg> args;
      for (size_t i = 0; i < 8; ++i)
        args.push_back(addr(n.inputs[i]));
      for (int r = 0; r < 3; ++r)
        args.push_back(addr(v, r));
      args.push_back(rows_arg());
      emit(qkv1, Rows::Tokens, 0, 1, args);
      emit(qkv, Rows::Tokens, 2, kDecodeTokens, std::move(args));
      // Steps of more than 8 tokens: the three gemm linears.
      outer_lo_ = kDecodeTokens + 1;
      for (int r = 0; r < 3; ++r)
        linear(-1, gemms[size_t(r)], dims[size_t(r)], Rows::Tokens, addr(n.inputs[0]),
               addr(n.inputs[1]), addr(n.inputs[size_t(2 + 2 * r)]),
               addr(n.inputs[size_t(3 + 2 * r)]), LaunchArg{}, addr(v, r), r > 0);
      outer_lo_ = 0;
    }
    const auto [table, att] = yarn_table(v, head_dim);
    const int hq = static_dim(g_, v, 1, 0), hk = static_dim(g_, v, 1, 1);
    const int rope = k_.add(codegen::emit_rope_yarn_qk(hq, hk, head_dim, att, ir_lines(g_, v)));
    const auto [kw, vw] = kv_writes_of(v);
    if (kw < 0) {
      emit(rope, Rows::Tokens, 0, -1, {addr(v, 0), addr(v, 1), addr(n.inputs.back()), table});
      return;
    }
    // Decode steps (one token per sequence): the rotation and both cache writes in one launch;
    // other steps rotate here and write the caches after attention (kv_write).
    const Node& kn = g_.node(kw);
    const ValueId kc = cache_node(kn.inputs[0]), vc = cache_node(g_.node(vw).inputs[0]);
    const int rope_kv =
        k_.add(codegen::emit_rope_yarn_qk_kv(hq, hk, head_dim, att, cache_slots(kc),
                                             g_.type(kc).dtype == ir::DType::F32, ir_lines(g_, v)));
    outer_per_seq_ = -1;
    emit(rope, Rows::Tokens, 0, -1, {addr(v, 0), addr(v, 1), addr(n.inputs.back()), table});
    outer_per_seq_ = 1;
    emit(rope_kv, Rows::Tokens, 0, -1,
         {addr(v, 0), addr(v, 1), addr(v, 2), addr(n.inputs.back()), addr(kn.inputs[3]),
          addr(kn.inputs[4]), table, addr(kc), addr(vc)});
    outer_per_seq_ = 0;
    kv_in_rope_.insert(kw);
    kv_in_rope_.insert(vw);
  }

  /// The kv_write nodes that store qkv_rope `v`'s k and v (results 1 and 2, through extract)
  /// at its positions into two caches of one shape and dtype; {-1, -1} when there is not
  /// exactly that pair.
  std::pair<ValueId, ValueId> kv_writes_of(ValueId v) const {
    const ValueId positions = g_.node(v).inputs.back();
    ValueId found[3] = {-1, -1, -1};
    for (ValueId u = v + 1; u < static_cast<ValueId>(g_.size()); ++u) {
      const Node& w = g_.node(u);
      if (w.op != Op::KvWrite || w.inputs[2] != positions)
        continue;
      const Node& x = g_.node(w.inputs[1]);
      if (x.op != Op::Extract || x.inputs[0] != v)
        continue;
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

  /// The KV cache node a cache operand (a cache or an earlier kv_write of it) stands for.
  ValueId cache_node(ValueId v) const {
    while (g_.node(v).op == Op::KvWrite)
      v = g_.node(v).inputs[0];
    XSERV_CHECK(g_.node(v).op == Op::Cache,
                "cache operand is not a cache: " + ir::print_node(g_, v));
    return v;
  }

  int cache_slots(ValueId cache) const {
    const ir::Dim& d = g_.type(cache).shape.at(1);
    return as_int(d.name.empty() ? d.size : c_.max_seq);
  }

  void lower_attention(ValueId v) {
    const Node& n = g_.node(v);
    const ValueId kc = cache_node(n.inputs[3]);
    codegen::AttentionDims d;
    d.heads = static_dim(g_, v, 1);
    d.head_dim = static_dim(g_, v, 2);
    d.kv_heads = static_dim(g_, n.inputs[1], 1);
    d.slots = cache_slots(kc);
    d.window = as_int(n.attr_int("window"));
    d.scale = n.attr_float("scale");
    d.f32_cache = g_.type(kc).dtype == ir::DType::F32;
    const int dec = k_.add(codegen::emit_attention_decode(d, ir_lines(g_, v)));
    // Steps of many tokens: query tiles that load each key/value tile once for all of them.
    const bool tiled = gemm_path() && 128 % (d.heads / d.kv_heads) == 0 && d.head_dim % 16 == 0;
    const int pre = tiled ? k_.add(codegen::emit_attention_prefill(d, ir_lines(g_, v))) : -1;
    // The combine step depends only on heads and head_dim: one generic header for every node.
    const int comb = k_.add(codegen::emit_attention_combine(
        d, {"merges the key splits of attention(...) for any window and scale"}));
    std::vector<LaunchArg> in;
    for (size_t i = 0; i < 10; ++i)
      in.push_back(i == 3 || i == 4 ? addr(cache_node(n.inputs[i])) : addr(n.inputs[i]));
    const LaunchArg out = addr(v);
    // Splits from the bucketed key count of the step (the executor's splits rule, window 0:
    // none); a split past a token's keys stays empty. Many tokens fill the GPU without key
    // splits (and their buffers stay small).
    const int window = std::max(0, d.window);
    std::vector<LaunchArg> dec_args = in;
    for (const LaunchArg& a : {out, part_ml_, part_o_})
      dec_args.push_back(a);
    emit(dec, Rows::Tokens, 0, kSplitTokens, dec_args, 0, window);
    if (pre >= 0) {
      std::vector<LaunchArg> pre_args = in;
      pre_args.push_back(out);
      pre_args.push_back(rows_arg());
      emit(pre, Rows::Tokens, kSplitTokens + 1, -1, std::move(pre_args));
    } else {
      emit(dec, Rows::Tokens, kSplitTokens + 1, -1, dec_args);
    }
    emit(comb, Rows::Tokens, 0, kSplitTokens, {part_ml_, part_o_, in[5], splits_arg(), out}, 0,
         window, 2);
  }

  void lower_kv_write(ValueId v) {
    const Node& n = g_.node(v);
    const ValueId cache = cache_node(n.inputs[0]);
    const codegen::KvWriteDims d{static_dim(g_, n.inputs[1], 1), static_dim(g_, n.inputs[1], 2),
                                 cache_slots(cache), g_.type(cache).dtype == ir::DType::F32};
    const int kernel = k_.add(codegen::emit_kv_write(d, ir_lines(g_, v)));
    // In decode steps rope_yarn_qk_kv already wrote this one (kv_in_rope_).
    outer_per_seq_ = kv_in_rope_.count(v) ? -1 : 0;
    emit(kernel, Rows::Tokens, 0, -1,
         {addr(cache), addr(n.inputs[1]), addr(n.inputs[2]), addr(n.inputs[3]), addr(n.inputs[4])});
    outer_per_seq_ = 0;
  }

  void topk(ValueId v, int experts, int k, LaunchArg logits) {
    const int kernel = k_.add(codegen::emit_router_topk({experts, k}, ir_lines(g_, v)));
    emit(kernel, Rows::Tokens, 0, -1, {logits, addr(v, 0), addr(v, 1)});
  }

  void lower_router(ValueId v) {
    const Node& n = g_.node(v);
    codegen::LinearDims d;
    d.k = static_dim(g_, n.inputs[1], 1);
    d.n = static_dim(g_, n.inputs[1], 0);
    d.bias = n.inputs.size() == 3;
    const int k = as_int(n.attr_int("k"));
    const ValueId norm = n.inputs[0];
    const bool fused_decode = router_of_norm(norm) == v;
    if (fused_decode) {
      // Decode steps: the norm before the router, the router's logits and top-k in one launch
      // (writing the norm's output for the experts too); longer steps as below.
      const Node& nn = g_.node(norm);
      const int fused = k_.add(codegen::emit_norm_router_topk(d.k, {d.n, k}, nn.attr_float("eps"),
                                                              d.bias, ir_lines(g_, v)));
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
    const bool gemv_used = !fused_decode || !(gemm_path() && codegen::gemm_fits(d.k));
    const int kernel = gemv_used ? k_.add(codegen::emit_linear(d, ir_lines(g_, v))) : -1;
    linear(kernel, dense_gemm(d, v), d, Rows::Tokens, addr(n.inputs[0]), LaunchArg{},
           addr(n.inputs[1]), d.bias ? addr(n.inputs[2]) : LaunchArg{}, LaunchArg{},
           router_logits_);
    topk(v, d.n, k, router_logits_);
    outer_lo_ = 0;
  }

  /// The router node that fuses rms_norm node `norm` into its decode launch (norm_router_topk),
  /// or -1: a router whose input is this norm, with an even expert count and a row length the
  /// GEMV takes.
  ValueId router_of_norm(ValueId norm) const {
    if (g_.node(norm).op != Op::RmsNorm || rows_kind(g_, norm) != Rows::Tokens)
      return -1;
    for (ValueId u = norm + 1; u < static_cast<ValueId>(g_.size()); ++u) {
      const Node& r = g_.node(u);
      if (r.op != Op::Router || r.inputs[0] != norm)
        continue;
      const int experts = static_dim(g_, r.inputs[1], 0), dim = static_dim(g_, r.inputs[1], 1);
      return experts % 2 == 0 && experts <= 256 && dim % 8 == 0 &&
                     as_int(r.attr_int("k")) <= experts
                 ? u
                 : -1;
    }
    return -1;
  }

  void lower_moe(ValueId v) {
    const Node& n = g_.node(v);
    codegen::MoeDims d;
    d.experts = static_dim(g_, n.inputs[3], 0);
    d.hidden = static_dim(g_, n.inputs[3], 2);
    d.inter = static_dim(g_, n.inputs[5], 2);
    d.k = static_dim(g_, n.inputs[1], 1);
    d.residual = n.op == Op::MoeExpertsResidual;
    d.limit = n.attr_float("limit");
    d.alpha = n.attr_float("alpha");
    const int gu = k_.add(codegen::emit_moe_gate_up(d, ir_lines(g_, v)));
    // Decode: gate_up + SwiGLU per (token, slot), the down rows per (token, slot), combine.
    const int dn = k_.add(codegen::emit_moe_down_part(d, ir_lines(g_, v)));
    const int combine =
        k_.add(codegen::emit_moe_combine(d.hidden, d.k, d.residual, ir_lines(g_, v)));
    std::vector<LaunchArg> in;
    for (ValueId i : n.inputs)
      in.push_back(addr(i));
    const LaunchArg act = moe_act_, y = addr(v), null;
    // Many tokens: sort the (token, slot) pairs by expert, one grouped gemm per matrix (gate_up
    // with the SwiGLU epilogue, down scattering weighted rows), and a deterministic combine.
    bool use_gemm = false;
    if (gemm_path() && codegen::gemm_fits(d.hidden) && codegen::gemm_fits(d.inter)) {
      for (size_t i = 0; i < 3; ++i) {
        const int bm = kMoeTileRows[i];
        codegen::MoeSortDims sd{d.experts, d.k, bm, c_.max_tokens * d.k};
        const int sort = k_.add(codegen::emit_moe_sort(
            sd, {"groups moe_experts(...)'s (token, slot) pairs by expert"}));
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
    emit(gu, Rows::Tokens, 0, dec_hi, {in[0], in[2], in[3], in[4], act});
    emit(dn, Rows::Tokens, 0, dec_hi, {act, in[1], in[2], in[5], in[6], moe_part_});
    if (d.residual)
      emit(combine, Rows::Tokens, 0, -1, {moe_part_, in[7], y});
    else
      emit(combine, Rows::Tokens, 0, -1, {moe_part_, y});
  }

  /// The sampling epilogue: every step ends with the greedy pick of each sequence's logits row,
  /// so a greedy decode step copies back a few keys per sequence, not the vocabulary's logits.
  void lower_sampling() {
    if (g_.outputs.empty())
      return;
    const ValueId logits = g_.outputs[0];
    const ir::Type& t = g_.type(logits);
    if (t.shape.size() != 2 || t.dtype != ir::DType::F32 || t.shape[0].name != "B")
      return;
    const int vocab = static_dim(g_, logits, 1);
    t_.argmax_chunks = codegen::argmax_chunks(vocab);
    const LaunchArg keys =
        allocate(size_t(c_.max_seqs) * size_t(t_.argmax_chunks) * sizeof(uint64_t));
    t_.argmax_scratch = keys.index;
    emit(k_.add(codegen::emit_argmax(vocab, ir_lines(g_, logits))), Rows::Seqs, 0, -1,
         {addr(logits), keys});
  }

  void lower(ValueId v) {
    const Node& n = g_.node(v);
    switch (n.op) {
    case Op::Param:
    case Op::Weight:
    case Op::Cache:
    case Op::Reshape:
    case Op::Extract:
    case Op::Recv: // a pipeline stage's input buffer, filled by the transport before the step
    case Op::Send: // an alias of its operand, read by the transport after the step
      return;      // sources and aliases: nothing to launch
    case Op::Embedding: {
      const codegen::EmbeddingDims d{static_dim(g_, n.inputs[0], 0),
                                     static_dim(g_, n.inputs[0], 1)};
      emit(k_.add(codegen::emit_embedding(d, ir_lines(g_, v))), Rows::Tokens, 0, -1,
           {addr(n.inputs[0]), addr(n.inputs[1]), addr(v)});
      return;
    }
    case Op::RmsNorm: {
      const codegen::RmsNormDims d{static_dim(g_, v, g_.type(v).shape.size() - 1),
                                   n.attr_float("eps")};
      // Before a router, decode steps norm inside norm_router_topk (lower_router).
      if (router_of_norm(v) >= 0)
        outer_lo_ = kDecodeTokens + 1;
      emit(k_.add(codegen::emit_rms_norm(d, ir_lines(g_, v))), rows_kind(g_, v), 0, -1,
           {addr(n.inputs[0]), addr(n.inputs[1]), addr(v)});
      outer_lo_ = 0;
      return;
    }
    case Op::SelectRows: {
      const auto& shape = g_.type(v).shape;
      int width = 1;
      for (size_t i = 1; i < shape.size(); ++i)
        width *= static_dim(g_, v, i);
      emit(k_.add(codegen::emit_select_rows({width}, ir_lines(g_, v))), Rows::Seqs, 0, -1,
           {addr(n.inputs[0]), addr(n.inputs[1]), addr(v)});
      return;
    }
    case Op::Linear:
    case Op::RmsNormLinear:
    case Op::LinearResidual:
      return lower_linear(v);
    case Op::RopeYarn:
      return rope(v, static_dim(g_, v, 1), static_dim(g_, v, 2), addr(n.inputs[0]), addr(v));
    case Op::QkvRope:
      return lower_qkv_rope(v);
    case Op::Attention:
      return lower_attention(v);
    case Op::KvWrite:
      return lower_kv_write(v);
    case Op::RouterTopK:
      return topk(v, static_dim(g_, n.inputs[0], 1), as_int(n.attr_int("k")), addr(n.inputs[0]));
    case Op::Router:
      return lower_router(v);
    case Op::MoeExperts:
    case Op::MoeExpertsResidual:
      return lower_moe(v);
    default:
      throw Error(fmt::format("the CUDA engine cannot run '{}' yet: {}", ir::op_name(n.op),
                              ir::print_node(g_, v)));
    }
  }

  const ir::Graph& g_;
  KernelSet& k_;
  const LoweringContext& c_;
  runtime::LaunchTable t_;
  std::map<ValueId, int> cache_index_; ///< cache nodes in graph order
  std::string label_;                  ///< op of the node being lowered
  int outer_per_seq_ = 0;              ///< PlanLaunch::one_per_seq of every emitted entry
  std::set<ValueId> kv_in_rope_;       ///< kv_writes rope_yarn_qk_kv does in decode steps
  int outer_lo_ = 0, outer_hi_ = -1;   ///< row range every emitted entry is limited to
  LaunchArg part_ml_, part_o_, router_logits_, moe_act_;
  LaunchArg inv_rms_, moe_pair_, moe_tiles_, moe_part_;
  LaunchArg splitk_part_;
  size_t splitk_bytes_ = 0;
};

} // namespace

runtime::LaunchTable lower_graph(const ir::Graph& g, KernelSet& kernels,
                                 const LoweringContext& ctx) {
  return Lowerer(g, kernels, ctx).run();
}

} // namespace xserv::cli
