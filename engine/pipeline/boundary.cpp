// What crosses a pipeline stage boundary, from the stage programs, and the check every received
// activation passes before a stage reads it (engine/pipeline/boundary.h).
#include "engine/pipeline/boundary.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/error.h"
#include "models/gpt_oss.h"

namespace xserv::engine::pipeline {

namespace {

BoundaryTensor boundary_of(const ir::Graph& g, ir::ValueId v, int64_t tokens) {
  const ir::Type& t = g.type(v);
  BoundaryTensor b;
  b.name = g.node(v).attr_str("name");
  b.dtype = t.dtype;
  for (const ir::Dim& d : t.shape) {
    if (!d.is_static() && d.name != ir::dims::kTokens)
      throw Error(fmt::format("pipeline stage boundary '{}': dimension {} is not the step's "
                              "tokens (T), so its size is unknown",
                              b.name, d.name));
    b.shape.push_back(d.is_static() ? d.size : tokens);
  }
  return b;
}

std::string shape_text(ir::DType dt, const std::vector<int64_t>& shape) {
  return fmt::format("{}[{}]", ir::dtype_name(dt), fmt::join(shape, ", "));
}

} // namespace

int64_t token_count(const models::StepInput& in) {
  int64_t n = 0;
  for (const auto& t : in.tokens)
    n += static_cast<int64_t>(t.size());
  return n;
}

namespace {

/// A boundary value of `row_bytes` fp32 bytes per token.
BoundaryTensor boundary_rows(const std::string& name, uint64_t row_bytes, int64_t tokens) {
  return {name, ir::DType::F32, {tokens, static_cast<int64_t>(row_bytes / sizeof(float))}};
}

} // namespace

std::vector<BoundaryTensor> stage_receives(const runtime::PlanStage& s, int64_t tokens) {
  std::vector<BoundaryTensor> out;
  for (const runtime::StageLayout::Recv& r : s.layout.recvs)
    out.push_back(boundary_rows(r.name, r.row_bytes, tokens));
  return out;
}

std::vector<BoundaryTensor> stage_sends(const runtime::PlanStage& s, int64_t tokens) {
  if (!s.layout.output.sends)
    return {};
  if (s.sends.size() != 1)
    throw Error(fmt::format("a pipeline stage sends its one output, this one names {} sends",
                            s.sends.size()));
  return {boundary_rows(s.sends[0].name, s.layout.output.row_bytes, tokens)};
}

std::vector<BoundaryTensor> stage_receives(const ir::Graph& g, int64_t tokens) {
  std::vector<BoundaryTensor> out;
  for (ir::ValueId v = 0; v < static_cast<ir::ValueId>(g.size()); ++v)
    if (g.node(v).op == ir::Op::Recv)
      out.push_back(boundary_of(g, v, tokens));
  return out;
}

std::vector<BoundaryTensor> stage_sends(const ir::Graph& g, int64_t tokens) {
  std::vector<BoundaryTensor> out;
  for (ir::ValueId v : g.outputs)
    if (g.node(v).op == ir::Op::Send)
      out.push_back(boundary_of(g, v, tokens));
  return out;
}

uint64_t boundary_bytes(const std::vector<BoundaryTensor>& tensors) {
  constexpr uint64_t kMax = UINT64_MAX;
  uint64_t total = 0;
  for (const BoundaryTensor& t : tensors) {
    uint64_t bytes = 4;
    for (int64_t d : t.shape) {
      const auto n = static_cast<uint64_t>(std::max<int64_t>(d, 0));
      bytes = n != 0 && bytes > kMax / n ? kMax : bytes * n;
    }
    total = bytes > kMax - total ? kMax : total + bytes;
  }
  return total;
}

void check_boundary(const Named& got, const std::vector<BoundaryTensor>& want,
                    const std::string& peer) {
  std::vector<bool> seen(want.size(), false);
  for (const auto& entry : got) {
    const std::string& name = entry.first; // not a structured binding: the lambda captures it
    const ir::Tensor& t = entry.second;
    const auto it = std::find_if(want.begin(), want.end(),
                                 [&](const BoundaryTensor& w) { return w.name == name; });
    if (it == want.end())
      throw Error(fmt::format("{} sent activation '{}' ({}), which this stage boundary does not "
                              "carry",
                              peer, name, shape_text(t.dtype, t.shape)));
    const size_t k = static_cast<size_t>(it - want.begin());
    if (seen[k])
      throw Error(fmt::format("{} sent activation '{}' twice", peer, name));
    seen[k] = true;
    // Storage follows the dtype (ir::Tensor): float dtypes in f, integer ones in i.
    const size_t held = t.is_int() ? t.i.size() : t.f.size();
    uint64_t elems = 1;
    for (int64_t d : it->shape)
      elems *= static_cast<uint64_t>(d);
    if (t.dtype != it->dtype || t.shape != it->shape || held != elems)
      throw Error(fmt::format("{} sent activation '{}' as {}; the plan's stage boundary carries "
                              "{} for this step",
                              peer, name, shape_text(t.dtype, t.shape),
                              shape_text(it->dtype, it->shape)));
  }
  for (size_t k = 0; k < want.size(); ++k)
    if (!seen[k])
      throw Error(fmt::format("{} did not send activation '{}' ({})", peer, want[k].name,
                              shape_text(want[k].dtype, want[k].shape)));
}

} // namespace xserv::engine::pipeline
