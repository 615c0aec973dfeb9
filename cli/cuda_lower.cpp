// Node-by-node lowering of the fused graph to the codegen kernels, and their compilation.
//
// Every node gets the kernels of both paths and a launch function that picks by the step's size
// (docs/DESIGN.md, kernel selection): decode GEMVs for at most 8 rows, tensor-core gemms (split K
// up to 64 rows) above, grouped expert gemms for the MoE, query-tiled attention above 64 tokens.
// The engine captures decode launches as CUDA graphs, which is why launches depend on the step
// only through its sizes (tokens, sequences, attention key bucket).
#include "cli/cuda_lower.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <regex>
#include <thread>

#include <fmt/format.h>

#include "codegen/emit_prefill.h"
#include "ir/error.h"
#include "ir/interpreter.h"
#include "ir/reference.h"
#include "runtime/device.h"
#include "runtime/kernel_cache.h"

namespace xserv::cli {

std::filesystem::path kernel_cache_dir() {
  namespace fs = std::filesystem;
  if (const char* d = std::getenv("XSERV_KERNEL_CACHE"); d && *d)
    return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d)
    return fs::path(d) / "xserv/kernels";
  if (const char* h = std::getenv("HOME"); h && *h)
    return fs::path(h) / ".cache/xserv/kernels";
  return fs::temp_directory_path() / "xserv-kernels";
}

int KernelSet::add(codegen::KernelSource src) {
  if (auto it = by_name_.find(src.name); it != by_name_.end()) {
    ++uses_[static_cast<size_t>(it->second)];
    return it->second;
  }
  const int i = static_cast<int>(sources_.size());
  by_name_[src.name] = i;
  sources_.push_back(std::move(src));
  uses_.push_back(1);
  return i;
}

int KernelSet::build(const std::filesystem::path& cache_dir) {
  runtime::CompileOptions opts;
  opts.arch = runtime::probe_device().arch();
  opts.headers = codegen::kernel_headers();
  // NVRTC compiles independent programs in parallel; each kernel has its own cache files.
  std::vector<std::future<runtime::CachedCubin>> jobs;
  for (const auto& s : sources_)
    jobs.push_back(std::async(std::launch::async, [&s, &opts, &cache_dir] {
      return runtime::get_or_compile(s.source, s.name, opts, cache_dir);
    }));
  int compiled = 0;
  for (size_t i = 0; i < sources_.size(); ++i) {
    runtime::CachedCubin c = jobs[i].get();
    compiled += c.compiled ? 1 : 0;
    modules_.push_back(runtime::Module::load(c.cubin, sources_[i].name));
    kernels_.push_back(modules_.back().kernel(sources_[i].name));
  }
  return compiled;
}

int step_token_capacity(int64_t max_batch, int prefill_chunk) {
  return static_cast<int>(std::max<int64_t>({8, max_batch, prefill_chunk}));
}

int attention_key_bucket(int keys) {
  int b = 64;
  while (b < keys && b < 2048)
    b *= 2;
  return b;
}

namespace {

using ir::Node;
using ir::Op;
using ir::ValueId;

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

int rows_of(Rows r, const DeviceStep& s) {
  return r == Rows::Tokens ? s.tokens : s.seqs;
}

/// The IR line a kernel's source is headed by: the node with its value numbers blanked, so
/// that every node a kernel serves gives the same source (and one cache entry).
std::vector<std::string> ir_lines(const ir::Graph& g, ValueId v) {
  return {std::regex_replace(ir::print_node(g, v), std::regex("%[0-9]+"), "%_")};
}

float* f32(void* p) {
  return static_cast<float*>(p);
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

/// Lowers one graph; holds the per-graph scratch buffers.
class Lowerer {
public:
  Lowerer(const ir::Graph& g, KernelSet& k, LoweringContext& c) : g_(g), k_(k), c_(c) {}

  std::vector<LaunchFn> run(std::vector<std::string>* labels) {
    allocate_scratch();
    for (ValueId v = 0; v < static_cast<ValueId>(g_.size()); ++v) {
      lower(v);
      if (labels) // one label per launch function: the op of the node it came from
        labels->resize(out_.size(), std::string(ir::op_name(g_.node(v).op)));
    }
    lower_sampling();
    if (labels)
      labels->resize(out_.size(), "argmax");
    return std::move(out_);
  }

private:
  void* addr(ValueId v, int r = 0) const { return c_.address(v, r); }

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
      part_o_ = c_.allocate(ts * attn * splits * sizeof(float), nullptr);
      part_ml_ = c_.allocate(ts * attn * splits * 2 * sizeof(float), nullptr); // per head: <= D
    }
    if (router)
      router_logits_ = c_.allocate(t * router * sizeof(float), nullptr);
    if (act)
      moe_act_ = c_.allocate(t * act * sizeof(float), nullptr);
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
      moe_part_ = c_.allocate(pairs * hidden * sizeof(float), nullptr);
    if (!gemm_path())
      return;
    if (width)
      inv_rms_ = c_.allocate(t * sizeof(float), nullptr);
    if (pairs) {
      moe_pair_ = c_.allocate(pairs * sizeof(int), nullptr);
      moe_tiles_ = c_.allocate(codegen::moe_tiles_ints(int(pairs), int(experts), kMoeTileRows[0]) *
                                   sizeof(int),
                               nullptr);
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
    void* part = nullptr; ///< [splitk, kSmallGemmRows, n] fp32 partial sums
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
        splitk_part_ = c_.allocate(bytes, nullptr);
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

  /// Launches a linear over `rows` of x: one decode GEMV launch for at most 8 rows, else the
  /// tensor-core gemm (after the rows' inv-rms, unless `inv_ready`: an earlier launch of this
  /// step computed it for the same x).
  void linear(int kernel, const DenseGemm& gemm, const codegen::LinearDims& d, Rows rows,
              const void* x, const void* ln, const void* w, const void* b, const void* h, void* y,
              bool inv_ready = false) {
    const KernelSet* ks = &k_;
    const void* inv = inv_rms_;
    out_.push_back([=](const DeviceStep& s) {
      const int total = rows_of(rows, s);
      if (total > d.max_tokens && gemm.large >= 0) {
        if (d.norm && !inv_ready)
          ks->launch(gemm.inv, total, 1, s.stream, x, inv);
        const void* norm_inv = d.norm ? inv : nullptr;
        if (total > kSmallGemmRows || gemm.splitk == 1) {
          const int kg = total > kSmallGemmRows ? gemm.large
                         : total <= 32          ? gemm.small32
                                                : gemm.small64;
          launch_ptrs(*ks, kg, total, s.stream,
                      {x, norm_inv, ln, w, b, h, y, nullptr, nullptr, nullptr}, total);
          return;
        }
        launch_ptrs(*ks, total <= 32 ? gemm.small32 : gemm.small64, total, s.stream,
                    {x, norm_inv, ln, w, nullptr, nullptr, gemm.part, nullptr, nullptr, nullptr},
                    total);
        launch_ptrs(*ks, gemm.reduce, total, s.stream, {gemm.part, b, h, y}, total);
        return;
      }
      for (int r0 = 0; r0 < total; r0 += d.max_tokens) {
        const int n = std::min(d.max_tokens, total - r0);
        const float* xc = static_cast<const float*>(x) + size_t(r0) * d.k;
        const float* hc = h ? static_cast<const float*>(h) + size_t(r0) * d.n : nullptr;
        float* yc = f32(y) + size_t(r0) * d.n;
        std::vector<const void*> args = {xc};
        if (d.norm)
          args.push_back(ln);
        args.push_back(w);
        if (d.bias)
          args.push_back(b);
        if (d.residual)
          args.push_back(hc);
        args.push_back(yc);
        launch_ptrs(*ks, kernel, n, s.stream, args, n);
      }
    });
  }

  /// Launches kernel `i` with pointer arguments and one trailing int.
  static void launch_ptrs(const KernelSet& ks, int i, int rows, cudaStream_t stream,
                          std::vector<const void*> ptrs, int tail) {
    std::vector<void*> slots;
    std::vector<size_t> sizes;
    for (const void*& p : ptrs) {
      slots.push_back(&p);
      sizes.push_back(sizeof(void*));
    }
    slots.push_back(&tail);
    sizes.push_back(sizeof(int));
    ks.launch_raw(i, rows, 1, stream, slots.data(), sizes.data(), slots.size());
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
    linear(kernel, dense_gemm(d, v), d, rows_kind(g_, v), addr(n.inputs[0]),
           norm ? addr(n.inputs[1]) : nullptr, addr(n.inputs[wi]),
           d.bias ? addr(n.inputs[wi + 1]) : nullptr, residual ? addr(n.inputs.back()) : nullptr,
           addr(v));
  }

  /// The YaRN table (float64 inv_freq on the device) and attention factor of a rope node.
  std::pair<const void*, double> yarn_table(ValueId v, int head_dim) {
    const ir::ref::Yarn yarn = ir::yarn_of(g_.node(v));
    const std::vector<double> inv = ir::ref::yarn_inv_freq(yarn, head_dim);
    return {c_.allocate(inv.size() * sizeof(double), inv.data()),
            ir::ref::yarn_attention_factor(yarn)};
  }

  /// rope_yarn of [T, heads, head_dim] from `x` into `y` (may alias), the node's YaRN attributes.
  void rope(ValueId v, int heads, int head_dim, const void* x, void* y) {
    const auto [table, att] = yarn_table(v, head_dim);
    const codegen::RopeDims d{heads, head_dim, att};
    const int kernel = k_.add(codegen::emit_rope_yarn(d, ir_lines(g_, v)));
    const void* pos = addr(g_.node(v).inputs.back());
    const KernelSet* ks = &k_;
    out_.push_back(
        [=](const DeviceStep& s) { ks->launch(kernel, s.tokens, 1, s.stream, x, pos, table, y); });
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
               addr(n.inputs[size_t(3 + 2 * r)]), nullptr, addr(v, r), r > 0);
    } else {
      const int qkv = k_.add(codegen::emit_qkv_decode(qd, ir_lines(g_, v)));
      // Steps of more than 8 tokens: the three gemm linears, pushed as one launch function.
      std::vector<LaunchFn> big;
      std::swap(big, out_);
      for (int r = 0; r < 3; ++r)
        linear(-1, gemms[size_t(r)], dims[size_t(r)], Rows::Tokens, addr(n.inputs[0]),
               addr(n.inputs[1]), addr(n.inputs[size_t(2 + 2 * r)]),
               addr(n.inputs[size_t(3 + 2 * r)]), nullptr, addr(v, r), r > 0);
      std::swap(big, out_);
      std::vector<const void*> args;
      for (size_t i = 0; i < 8; ++i)
        args.push_back(addr(n.inputs[i]));
      for (int r = 0; r < 3; ++r)
        args.push_back(addr(v, r));
      const KernelSet* ks = &k_;
      out_.push_back([=](const DeviceStep& s) {
        if (s.tokens > kDecodeTokens) {
          for (const LaunchFn& f : big)
            f(s);
          return;
        }
        launch_ptrs(*ks, qkv, s.tokens, s.stream, args, s.tokens);
      });
    }
    const auto [table, att] = yarn_table(v, head_dim);
    const int hq = static_dim(g_, v, 1, 0), hk = static_dim(g_, v, 1, 1);
    const int rope = k_.add(codegen::emit_rope_yarn_qk(hq, hk, head_dim, att, ir_lines(g_, v)));
    void *q = addr(v, 0), *k = addr(v, 1);
    const void* pos = addr(n.inputs.back());
    const KernelSet* ks = &k_;
    out_.push_back(
        [=](const DeviceStep& s) { ks->launch(rope, s.tokens, 1, s.stream, q, k, pos, table); });
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
    std::vector<const void*> in;
    for (size_t i = 0; i < 10; ++i)
      in.push_back(i == 3 || i == 4 ? addr(cache_node(n.inputs[i])) : addr(n.inputs[i]));
    void* out = addr(v);
    void *ml = part_ml_, *po = part_o_;
    const KernelSet* ks = &k_;
    const int window = d.window;
    out_.push_back([=](const DeviceStep& s) {
      // Splits from the bucketed key count, so that they stay fixed over a range of positions
      // (and one CUDA graph serves them all); a split past a token's keys stays empty.
      const int bucket = attention_key_bucket(s.max_pos + 1);
      const int keys = window > 0 ? std::min(bucket, window) : bucket;
      // Many tokens fill the GPU without key splits (and their buffers stay small).
      if (s.tokens > kSplitTokens && pre >= 0) {
        ks->launch(pre, s.tokens, 1, s.stream, in[0], in[1], in[2], in[3], in[4], in[5], in[6],
                   in[7], in[8], in[9], out, s.tokens);
        return;
      }
      const int splits = s.tokens > kSplitTokens ? 1 : codegen::attention_splits(keys);
      ks->launch(dec, s.tokens, splits, s.stream, in[0], in[1], in[2], in[3], in[4], in[5], in[6],
                 in[7], in[8], in[9], out, ml, po);
      if (splits > 1)
        ks->launch(comb, s.tokens, 1, s.stream, static_cast<const void*>(ml),
                   static_cast<const void*>(po), in[5], splits, out);
    });
  }

  void lower_kv_write(ValueId v) {
    const Node& n = g_.node(v);
    const ValueId cache = cache_node(n.inputs[0]);
    const codegen::KvWriteDims d{static_dim(g_, n.inputs[1], 1), static_dim(g_, n.inputs[1], 2),
                                 cache_slots(cache), g_.type(cache).dtype == ir::DType::F32};
    const int kernel = k_.add(codegen::emit_kv_write(d, ir_lines(g_, v)));
    void* c = addr(cache);
    const void *x = addr(n.inputs[1]), *pos = addr(n.inputs[2]), *seq = addr(n.inputs[3]);
    const void* rows = addr(n.inputs[4]);
    const KernelSet* ks = &k_;
    out_.push_back([=](const DeviceStep& s) {
      ks->launch(kernel, s.tokens, 1, s.stream, c, x, pos, seq, rows);
    });
  }

  void topk(ValueId v, int experts, int k, const void* logits) {
    const int kernel = k_.add(codegen::emit_router_topk({experts, k}, ir_lines(g_, v)));
    void *w = addr(v, 0), *ids = addr(v, 1);
    const KernelSet* ks = &k_;
    out_.push_back(
        [=](const DeviceStep& s) { ks->launch(kernel, s.tokens, 1, s.stream, logits, w, ids); });
  }

  void lower_router(ValueId v) {
    const Node& n = g_.node(v);
    codegen::LinearDims d;
    d.k = static_dim(g_, n.inputs[1], 1);
    d.n = static_dim(g_, n.inputs[1], 0);
    d.bias = n.inputs.size() == 3;
    const int kernel = k_.add(codegen::emit_linear(d, ir_lines(g_, v)));
    linear(kernel, dense_gemm(d, v), d, Rows::Tokens, addr(n.inputs[0]), nullptr, addr(n.inputs[1]),
           d.bias ? addr(n.inputs[2]) : nullptr, nullptr, router_logits_);
    topk(v, d.n, as_int(n.attr_int("k")), router_logits_);
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
    std::vector<const void*> in;
    for (ValueId i : n.inputs)
      in.push_back(addr(i));
    void *act = moe_act_, *y = addr(v);
    const bool residual = d.residual;
    const KernelSet* ks = &k_;
    // Many tokens: sort the (token, slot) pairs by expert, one grouped gemm per matrix (gate_up
    // with the SwiGLU epilogue, down scattering weighted rows), and a deterministic combine.
    std::array<std::array<int, 3>, 3> grouped{}; // [tile size] -> sort, gate_up, down
    bool use_gemm = false;
    if (gemm_path() && codegen::gemm_fits(d.hidden) && codegen::gemm_fits(d.inter)) {
      for (size_t i = 0; i < 3; ++i) {
        const int bm = kMoeTileRows[i];
        codegen::MoeSortDims sd{d.experts, d.k, bm, c_.max_tokens * d.k};
        grouped[i][0] = k_.add(codegen::emit_moe_sort(
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
        grouped[i][1] = k_.add(codegen::emit_gemm(gd, ir_lines(g_, v)));
        gd.k = d.inter;
        gd.n = d.hidden;
        gd.gather = false;
        gd.epilogue = codegen::GemmEpilogue::Scatter;
        grouped[i][2] = k_.add(codegen::emit_gemm(gd, ir_lines(g_, v)));
      }
      use_gemm = true;
    }
    const void *pair = moe_pair_, *tiles = moe_tiles_;
    void* part = moe_part_;
    const int experts = d.experts, ksel = d.k;
    out_.push_back([=](const DeviceStep& s) {
      if (s.tokens > kDecodeTokens && use_gemm) {
        const auto& kk = grouped[size_t(moe_tile_index(s.tokens, ksel, experts))];
        launch_ptrs(*ks, kk[0], s.tokens, s.stream, {in[2], pair, tiles}, s.tokens);
        launch_ptrs(*ks, kk[1], s.tokens, s.stream,
                    {in[0], nullptr, nullptr, in[3], in[4], nullptr, act, pair, tiles, nullptr},
                    s.tokens);
        launch_ptrs(*ks, kk[2], s.tokens, s.stream,
                    {act, nullptr, nullptr, in[5], in[6], nullptr, part, pair, tiles, in[1]},
                    s.tokens);
        if (residual)
          ks->launch(combine, s.tokens, 1, s.stream, static_cast<const void*>(part), in[7], y);
        else
          ks->launch(combine, s.tokens, 1, s.stream, static_cast<const void*>(part), y);
        return;
      }
      ks->launch(gu, s.tokens, 1, s.stream, in[0], in[2], in[3], in[4], act);
      const void* a = act;
      ks->launch(dn, s.tokens, 1, s.stream, a, in[1], in[2], in[5], in[6], part);
      if (residual)
        ks->launch(combine, s.tokens, 1, s.stream, static_cast<const void*>(part), in[7], y);
      else
        ks->launch(combine, s.tokens, 1, s.stream, static_cast<const void*>(part), y);
    });
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
    c_.argmax_chunks = codegen::argmax_chunks(vocab);
    c_.argmax_keys = c_.allocate(
        size_t(c_.max_seqs) * size_t(c_.argmax_chunks) * sizeof(uint64_t), nullptr);
    per_row(logits, k_.add(codegen::emit_argmax(vocab, ir_lines(g_, logits))), Rows::Seqs,
            {addr(logits), c_.argmax_keys});
  }

  /// A per-row kernel over the value's rows with the given pointer arguments.
  void per_row(ValueId v, int kernel, Rows rows, std::vector<const void*> args) {
    const KernelSet* ks = &k_;
    out_.push_back([=](const DeviceStep& s) {
      const int r = rows_of(rows, s);
      if (args.size() == 2)
        ks->launch(kernel, r, 1, s.stream, args[0], args[1]);
      else if (args.size() == 3)
        ks->launch(kernel, r, 1, s.stream, args[0], args[1], args[2]);
      else
        ks->launch(kernel, r, 1, s.stream, args[0], args[1], args[2], args[3]);
    });
    (void)v;
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
      per_row(v, k_.add(codegen::emit_embedding(d, ir_lines(g_, v))), Rows::Tokens,
              {addr(n.inputs[0]), addr(n.inputs[1]), addr(v)});
      return;
    }
    case Op::RmsNorm: {
      const codegen::RmsNormDims d{static_dim(g_, v, g_.type(v).shape.size() - 1),
                                   n.attr_float("eps")};
      per_row(v, k_.add(codegen::emit_rms_norm(d, ir_lines(g_, v))), rows_kind(g_, v),
              {addr(n.inputs[0]), addr(n.inputs[1]), addr(v)});
      return;
    }
    case Op::SelectRows: {
      const auto& shape = g_.type(v).shape;
      int width = 1;
      for (size_t i = 1; i < shape.size(); ++i)
        width *= static_dim(g_, v, i);
      per_row(v, k_.add(codegen::emit_select_rows({width}, ir_lines(g_, v))), Rows::Seqs,
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
  LoweringContext& c_;
  std::vector<LaunchFn> out_;
  void *part_ml_ = nullptr, *part_o_ = nullptr, *router_logits_ = nullptr, *moe_act_ = nullptr;
  void *inv_rms_ = nullptr, *moe_pair_ = nullptr, *moe_tiles_ = nullptr, *moe_part_ = nullptr;
  void* splitk_part_ = nullptr;
  size_t splitk_bytes_ = 0;
};

} // namespace

std::vector<LaunchFn> lower_graph(const ir::Graph& g, KernelSet& kernels, LoweringContext& ctx,
                                  std::vector<std::string>* labels) {
  return Lowerer(g, kernels, ctx).run(labels);
}

} // namespace xserv::cli
