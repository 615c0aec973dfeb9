// build_gpt_oss(): emits MODEL.md's forward pass, layer by layer, through ir::Builder.
#include "models/gpt_oss.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "base/error.h"
#include "ir/builder.h"

namespace xserv::models {
namespace {

using ir::Attr;
using ir::Builder;
using ir::Dim;
using ir::DType;
using ir::Op;
using ir::Type;
using ir::ValueId;

const Dim kT = Dim::dynamic(ir::dims::kTokens);
const Dim kB = Dim::dynamic(ir::dims::kSeqs);

/// The runtime inputs shared by every layer.
struct Inputs {
  ValueId ids, positions, token_seq, ctx_lens, block_table, window_table;
};

class GptOssBuilder {
public:
  GptOssBuilder(const ModelConfig& c, ir::Graph& g, ir::DType kv, int64_t block)
      : c_(c), b_(g), kv_(kv), block_(block) {}

  Type bf16(ir::Shape s) const { return Type{DType::BF16, std::move(s)}; }

  ValueId w(const std::string& name, Type t) { return b_.weight(name, std::move(t)); }

  ValueId layer(int64_t l, ValueId h, const Inputs& in) {
    const std::string p = fmt::format("model.layers.{}.", l);
    const int64_t d = c_.hidden_size, hd = c_.head_dim, nh = c_.num_attention_heads;
    const int64_t nkv = c_.num_key_value_heads, e = c_.num_local_experts;
    const int64_t inter = c_.intermediate_size;
    const double eps = c_.rms_norm_eps;

    // Attention block.
    ValueId x =
        b_.add_node(Op::RmsNorm, {h, w(p + "input_layernorm.weight", bf16({d}))}, {{"eps", eps}});
    auto proj = [&](const char* name, int64_t out) {
      return b_.add_node(Op::Linear, {x, w(p + "self_attn." + name + ".weight", bf16({out, d})),
                                      w(p + "self_attn." + name + ".bias", bf16({out}))});
    };
    ValueId q = proj("q_proj", nh * hd), k = proj("k_proj", nkv * hd), v = proj("v_proj", nkv * hd);
    auto heads = [&](ValueId t, int64_t n) {
      return b_.add_typed(Op::Reshape, {t}, Type{DType::F32, {kT, n, hd}});
    };
    std::vector<std::pair<std::string, Attr>> rope = {
        {"theta", c_.rope_theta},
        {"factor", c_.rope_scaling.factor},
        {"original_max", static_cast<double>(c_.rope_scaling.original_max_position_embeddings)},
        {"beta_fast", c_.rope_scaling.beta_fast},
        {"beta_slow", c_.rope_scaling.beta_slow},
        {"truncate", int64_t{c_.rope_scaling.truncate ? 1 : 0}}};
    ValueId qr = b_.add_node(Op::RopeYarn, {heads(q, nh), in.positions}, rope);
    ValueId kr = b_.add_node(Op::RopeYarn, {heads(k, nkv), in.positions}, rope);
    ValueId vh = heads(v, nkv);

    const bool sliding = c_.is_sliding(l);
    const int64_t window = sliding ? c_.sliding_window : 0;
    const Dim blocks = Dim::dynamic(sliding ? ir::dims::kWindowBlocks : ir::dims::kKvBlocks);
    const Type cache_t{kv_, {blocks, block_, nkv, hd}};
    const ValueId table = sliding ? in.window_table : in.block_table;
    ValueId kc = b_.cache(p + "k_cache", cache_t), vc = b_.cache(p + "v_cache", cache_t);
    ValueId sinks = w(p + "self_attn.sinks", bf16({nh}));
    ValueId attn = b_.add_node(
        Op::Attention, {qr, kr, vh, kc, vc, sinks, in.positions, in.token_seq, in.ctx_lens, table},
        {{"scale", 1.0 / std::sqrt(static_cast<double>(hd))}, {"window", window}});
    // The step's keys go into the cache only after attention has read the earlier ones: a
    // sliding layer's blocks may be reused by the engine once no query sees them.
    b_.add_node(Op::KvWrite, {kc, kr, in.positions, in.token_seq, table}, {{"window", window}});
    b_.add_node(Op::KvWrite, {vc, vh, in.positions, in.token_seq, table}, {{"window", window}});
    ValueId flat = b_.add_typed(Op::Reshape, {attn}, Type{DType::F32, {kT, nh * hd}});
    ValueId o = b_.add_node(Op::Linear, {flat, w(p + "self_attn.o_proj.weight", bf16({d, nh * hd})),
                                         w(p + "self_attn.o_proj.bias", bf16({d}))});
    h = b_.add_node(Op::Add, {h, o});

    // Mixture-of-experts block.
    x = b_.add_node(Op::RmsNorm, {h, w(p + "post_attention_layernorm.weight", bf16({d}))},
                    {{"eps", eps}});
    ValueId logits = b_.add_node(Op::Linear, {x, w(p + "mlp.router.weight", bf16({e, d})),
                                              w(p + "mlp.router.bias", bf16({e}))});
    ValueId top = b_.add_node(Op::RouterTopK, {logits}, {{"k", c_.num_experts_per_tok}});
    ValueId tw = b_.add_node(Op::Extract, {top}, {{"index", int64_t{0}}});
    ValueId ti = b_.add_node(Op::Extract, {top}, {{"index", int64_t{1}}});
    const std::string ex = p + "mlp.experts.";
    ValueId moe =
        b_.add_node(Op::MoeExperts,
                    {x, tw, ti, w(ex + "gate_up_proj", Type{DType::MXFP4, {e, 2 * inter, d}}),
                     w(ex + "gate_up_proj_bias", bf16({e, 2 * inter})),
                     w(ex + "down_proj", Type{DType::MXFP4, {e, d, inter}}),
                     w(ex + "down_proj_bias", bf16({e, d}))},
                    {{"alpha", c_.swiglu_alpha}, {"limit", c_.swiglu_limit}});
    return b_.add_node(Op::Add, {h, moe});
  }

  void build(const BuildOptions& opts) {
    const Type tok{DType::I32, {kT}}, seq{DType::I32, {kB}};
    const Type table{DType::I32, {kB, Dim::dynamic(ir::dims::kTableBlocks)}};
    bool any_sliding = false;
    for (int64_t l = 0; l < c_.num_hidden_layers; ++l)
      any_sliding = any_sliding || c_.is_sliding(l);
    Inputs in{b_.param(params::kTokenIds, tok),
              b_.param(params::kPositions, tok),
              b_.param(params::kTokenSeq, tok),
              b_.param(params::kCtxLens, seq),
              b_.param(params::kBlockTable, table),
              any_sliding ? b_.param(params::kWindowTable, table) : ValueId(-1)};
    const int64_t d = c_.hidden_size, v = c_.vocab_size;
    ValueId h = b_.add_node(Op::Embedding, {w("model.embed_tokens.weight", bf16({v, d})), in.ids});
    for (int64_t l = 0; l < c_.num_hidden_layers; ++l)
      h = layer(l, h, in);
    ValueId x = b_.add_node(Op::RmsNorm, {h, w("model.norm.weight", bf16({d}))},
                            {{"eps", c_.rms_norm_eps}});
    if (opts.last_logits_only)
      x = b_.add_node(Op::SelectRows, {x, b_.param(params::kLogitRows, seq)});
    ValueId logits = b_.add_node(Op::Linear, {x, w("lm_head.weight", bf16({v, d}))});
    std::vector<ValueId> outs = {logits};
    if (opts.greedy)
      outs.push_back(b_.add_node(Op::Argmax, {logits}));
    b_.set_outputs(outs);
  }

private:
  const ModelConfig& c_;
  Builder b_;
  ir::DType kv_;
  int64_t block_;
};

} // namespace

ir::Graph build_gpt_oss(const ModelConfig& cfg, const BuildOptions& opts) {
  ir::Graph g;
  if (opts.kv_dtype != DType::F32 && opts.kv_dtype != DType::BF16)
    throw Error("the KV cache holds f32 or bf16 values");
  if (opts.kv_block < 1 || opts.kv_block > 1024 || (opts.kv_block & (opts.kv_block - 1)) != 0)
    throw Error(fmt::format("the KV block size must be a power of two in [1, 1024], got {}",
                            opts.kv_block));
  GptOssBuilder(cfg, g, opts.kv_dtype, opts.kv_block).build(opts);
  return g;
}

KvGeometry kv_geometry(const ir::Graph& g, int64_t max_seq) {
  KvGeometry k;
  k.block_size = 0;
  for (const ir::Node& n : g.nodes) {
    if (n.op == Op::Cache) {
      const int64_t bs = n.type().shape.at(1).size;
      if (k.block_size != 0 && bs != k.block_size)
        throw Error(fmt::format("the graph's KV caches have blocks of {} and {} positions",
                                k.block_size, bs));
      k.block_size = bs;
    } else if (n.op == Op::Attention) {
      k.window = std::max(k.window, n.attr_int("window"));
    }
  }
  if (k.block_size == 0)
    k.block_size = 16; // no cache in this graph (a pipeline stage without layers)
  k.table_blocks = k.blocks_for(max_seq);
  return k;
}

} // namespace xserv::models
