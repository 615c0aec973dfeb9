// Node-by-node lowering of the fused graph to the codegen kernels and a launch table.
//
// Every node gets the kernels of both paths and launch table entries whose row ranges pick by
// the step's size (docs/DESIGN.md, kernel selection): decode GEMVs for at most 8 rows,
// tensor-core gemms (split K up to 64 rows) above, grouped expert gemms for the MoE, query-tiled
// attention above 64 tokens. The engine captures decode launches as CUDA graphs, which is why
// launches depend on the step only through its sizes (tokens, sequences, attention key bucket).
#include "codegen/cuda_lower.h"

#include <algorithm>
#include <regex>

#include "codegen/cuda_lower_detail.h"
#include "codegen/emit_prefill.h"

namespace xserv::codegen {
namespace lowering {

std::vector<std::string> ir_lines(const ir::Graph& g, ValueId v) {
  static const std::regex value_id("%[0-9]+"); // compiled once: a node per kernel calls this
  return {std::regex_replace(ir::print_node(g, v), value_id, "%_")};
}

LaunchArg Lowerer::addr(ValueId v, int r) const {
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

runtime::LaunchTable Lowerer::run() {
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

bool Lowerer::row_rules(Rows rows, int lo, int hi, runtime::PlanLaunch& l) const {
  l.label = label_;
  l.seq_rows = rows == Rows::Seqs;
  l.min_rows = std::max(lo, outer_lo_);
  l.max_rows = outer_hi_ < 0 ? hi : hi < 0 ? outer_hi_ : std::min(hi, outer_hi_);
  l.one_per_seq = outer_per_seq_;
  l.part = part_;
  const int capacity = rows == Rows::Tokens ? c_.max_tokens : c_.max_seqs;
  return !((l.max_rows >= 0 && l.min_rows > l.max_rows) || l.min_rows > capacity);
}

void Lowerer::emit(int kernel, Rows rows, int lo, int hi, std::vector<LaunchArg> args, int chunk,
                   int splits_window, int min_splits, int splits_heads) {
  runtime::PlanLaunch l;
  l.kernel = kernel;
  if (!row_rules(rows, lo, hi, l))
    return;
  if (kernel < 0)
    throw Error(fmt::format("the CUDA engine has no kernel for {} steps of {} to {} rows", label_,
                            l.min_rows, l.max_rows));
  l.chunk = chunk;
  l.splits_window = splits_window;
  l.min_splits = min_splits;
  l.splits_heads = splits_heads;
  l.split_chunk = splits_window >= 0 ? split_chunk_ : 0;
  l.args = std::move(args);
  t_.launches.push_back(std::move(l));
}

void Lowerer::emit_library(int library, Rows rows, int lo, int hi, std::vector<LaunchArg> args) {
  runtime::PlanLaunch l;
  l.library = library;
  if (!row_rules(rows, lo, hi, l))
    return;
  l.args = std::move(args);
  t_.launches.push_back(std::move(l));
}

void Lowerer::allocate_scratch() {
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
    // Key splits only for steps of at most kSplitTokens tokens (see lower_attention); in the
    // canonical order at most kAttnChunkPartials (token, chunk) states.
    const size_t states =
        std::max<size_t>(std::min<size_t>(t, kSplitTokens) * splits, runtime::kAttnChunkPartials);
    part_o_ = allocate(states * attn * sizeof(float));
    part_ml_ = allocate(states * attn * 2 * sizeof(float)); // per head: <= D
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
  if (width && !c_.wgmma)
    inv_rms_ = allocate(t * sizeof(float));
  if (pairs) {
    moe_pair_ = allocate(pairs * sizeof(int));
    const int tile = c_.wgmma ? kWgMoeTilings[0].bn : kMoeTileRows[0];
    moe_tiles_ = allocate(codegen::moe_tiles_ints(int(pairs), int(experts), tile) * sizeof(int));
  }
  if (c_.wgmma) { // gemm_act's bf16 activations: the widest gemm input of a step
    size_t values = 0;
    for (ValueId v = 0; v < static_cast<ValueId>(g_.size()); ++v) {
      const Node& n = g_.node(v);
      switch (n.op) {
      case Op::Linear:
      case Op::LinearResidual:
      case Op::Router:
        values = std::max(values, t * size_t(static_dim(g_, n.inputs[1], 1)));
        break;
      case Op::RmsNormLinear:
      case Op::QkvRope:
        values = std::max(values, t * size_t(static_dim(g_, n.inputs[2], 1)));
        break;
      case Op::MoeExperts:
      case Op::MoeExpertsResidual:
        values = std::max(
            {values, t * size_t(static_dim(g_, n.inputs[3], 2)),
             t * size_t(static_dim(g_, n.inputs[1], 1)) * size_t(static_dim(g_, n.inputs[5], 2))});
        break;
      default:
        break;
      }
    }
    if (values) {
      wg_xh_ = allocate(values * 2);
      if (c_.gemm_split)
        wg_xl_ = allocate(values * 2);
    }
  }
}

void Lowerer::lower_sampling() {
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
  // Structured output's masked pick: outside every step, its rows the masked rows (at most one
  // a sequence), rewriting their keys after the step's argmax.
  t_.mask_words = codegen::mask_words(vocab);
  const LaunchArg masks = allocate(size_t(c_.max_seqs) * size_t(t_.mask_words) * 4);
  const LaunchArg rows = allocate(size_t(c_.max_seqs) * 4);
  t_.mask_scratch = masks.index;
  t_.mask_rows_scratch = rows.index;
  const size_t before = t_.launches.size();
  label_ = "argmax_masked";
  emit(k_.add(codegen::emit_argmax_masked(vocab, ir_lines(g_, logits))), Rows::Seqs, 0, -1,
       {addr(logits), masks, rows, keys});
  t_.masked_pick.assign(std::make_move_iterator(t_.launches.begin() + std::ptrdiff_t(before)),
                        std::make_move_iterator(t_.launches.end()));
  t_.launches.resize(before);
}

void Lowerer::lower(ValueId v) {
  const Node& n = g_.node(v);
  // The router's gemm activations stay valid for the MoE right after it (through extracts and
  // weights, which launch nothing); any other node's launches may reuse their input's buffer.
  if (n.op != Op::Router && n.op != Op::MoeExperts && n.op != Op::MoeExpertsResidual &&
      n.op != Op::Extract && n.op != Op::Reshape && n.op != Op::Weight && n.op != Op::Param)
    wg_act_valid_ = false;
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
    const codegen::EmbeddingDims d{static_dim(g_, n.inputs[0], 0), static_dim(g_, n.inputs[0], 1)};
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

} // namespace lowering

runtime::LaunchTable lower_graph(const ir::Graph& g, KernelSet& kernels,
                                 const LoweringContext& ctx) {
  return lowering::Lowerer(g, kernels, ctx).run();
}

} // namespace xserv::codegen
