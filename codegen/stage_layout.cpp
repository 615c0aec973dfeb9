// stage_layout(): the graph facts a compiled plan carries so that run needs no graph.
#include <algorithm>
#include <set>
#include <string>

#include <fmt/format.h>

#include "base/error.h"
#include "codegen/cuda_lower.h"
#include "ir/dims.h"

namespace xserv::codegen {

runtime::StageLayout stage_layout(const ir::Graph& g, const LoweringContext& ctx) {
  XSERV_CHECK(ctx.memory && !g.outputs.empty(), "stage_layout needs a memory plan and an output");
  const compiler::MemoryPlan& mem = *ctx.memory;
  runtime::StageLayout l;
  l.max_batch = ctx.max_seqs;
  l.max_seq = ctx.max_seq;
  l.tokens = ctx.max_tokens;
  l.gemm_split = ctx.gemm_split;
  l.expert_format = ctx.expert_format;
  l.arena_bytes = static_cast<uint64_t>(mem.arena_bytes);
  auto offset_of = [&](ir::ValueId v) -> uint64_t {
    const int32_t b = mem.buffer_of.at(size_t(v)).at(0);
    XSERV_CHECK(b >= 0, "value without a buffer: " + ir::print_node(g, v));
    return static_cast<uint64_t>(mem.buffers.at(size_t(b)).offset);
  };
  auto row_bytes = [&](ir::ValueId v) -> uint64_t {
    uint64_t bytes = sizeof(float);
    const auto& shape = g.type(v).shape;
    for (size_t i = 1; i < shape.size(); ++i)
      bytes *= static_cast<uint64_t>(shape[i].size);
    return bytes;
  };
  std::set<std::string> weight_names; // each weight once, however many nodes read it
  const ir::ValueId out = g.outputs[0];
  const ir::Type& out_type = g.type(out);
  l.output.offset = offset_of(out);
  l.output.row_bytes = row_bytes(out);
  l.output.per_token = out_type.shape.at(0).name == ir::dims::kTokens;
  l.output.sends = g.node(out).op == ir::Op::Send;
  l.output.vocab = out_type.shape.back().size;
  for (ir::ValueId v = 0; v < static_cast<ir::ValueId>(g.size()); ++v) {
    const ir::Node& n = g.node(v);
    if (n.op == ir::Op::Recv) {
      l.recvs.push_back({n.attr_str("name"), offset_of(v), row_bytes(v)});
    } else if (n.op == ir::Op::Cache) {
      const ir::Shape& s = g.type(v).shape;
      runtime::StageLayout::Cache c;
      for (size_t i = 1; i < s.size(); ++i)
        c.block_shape.push_back(s[i].size);
      c.elem_bytes = g.type(v).dtype == ir::DType::F32 ? 4 : 2;
      c.window = s.at(0).name == ir::dims::kWindowBlocks;
      l.kv_block = s.at(1).size;
      l.caches.push_back(std::move(c));
    } else if (n.op == ir::Op::Attention) {
      l.window = std::max(l.window, n.attr_int("window"));
    } else if (n.op == ir::Op::Weight && weight_names.insert(n.attr_str("name")).second) {
      runtime::StageLayout::Weight w;
      w.name = n.attr_str("name");
      for (const ir::Dim& d : n.type().shape)
        w.shape.push_back(d.size);
      // Both: the MXFP4 copy of an expert matrix the decode kernels read, beside it.
      if (ctx.expert_format == runtime::ExpertFormat::Both && n.type().dtype == ir::DType::MXFP4)
        l.weights.push_back({runtime::mxfp4_copy_name(w.name), w.shape});
      l.weights.push_back(std::move(w));
    }
  }
  l.table_blocks = (l.max_seq + l.kv_block - 1) / l.kv_block;
  return l;
}

} // namespace xserv::codegen
