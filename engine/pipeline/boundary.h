// What crosses a pipeline stage boundary: named activations, the dtypes and shapes a plan's
// stages declare for them (in their layouts, or their programs), and the check a rank makes
// before it reads what a peer sent (a frame's tensors, or the size of an NCCL receive). No CUDA
// and no engine: the pipeline frame fuzz target links it alone.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "models/step.h"
#include "runtime/plan_file.h"

namespace xserv::engine::pipeline {

/// Tensors by name: what a stage receives (recv names) and sends on (send names, or "out.0" for
/// the last stage's logits).
using Named = std::vector<std::pair<std::string, ir::Tensor>>;

/// A tensor that crosses a stage boundary, as the plan's stage program declares it: its name,
/// dtype and shape with the step's token count in place of T.
struct BoundaryTensor {
  std::string name;
  ir::DType dtype = ir::DType::F32;
  std::vector<int64_t> shape;
};

/// The tokens of a step, all sequences together (T).
int64_t token_count(const models::StepInput& in);

/// What plan stage `s` receives (its layout's recvs, in graph order) for a step of `tokens`
/// tokens: f32[tokens, row_bytes / 4] each, the residual stream a stage boundary carries.
std::vector<BoundaryTensor> stage_receives(const runtime::PlanStage& s, int64_t tokens);
/// What plan stage `s` sends on (its layout's output, under its send's name) for a step of
/// `tokens` tokens; empty for the last stage.
std::vector<BoundaryTensor> stage_sends(const runtime::PlanStage& s, int64_t tokens);

/// What stage `g` receives (its recv values, in graph order) for a step of `tokens` tokens.
std::vector<BoundaryTensor> stage_receives(const ir::Graph& g, int64_t tokens);
/// What stage `g` sends on (its send outputs, in order) for a step of `tokens` tokens; empty for
/// the last stage.
std::vector<BoundaryTensor> stage_sends(const ir::Graph& g, int64_t tokens);

/// The bytes `tensors` take in a pipeline frame (4 per element: f32 and i32 alike), saturating
/// at UINT64_MAX instead of wrapping.
uint64_t boundary_bytes(const std::vector<BoundaryTensor>& tensors);

/// Checks activations `got` that arrived from `peer` (e.g. "pipeline rank 2") against `want`
/// before anything reads them: each wanted name once and nothing else, each with the plan's
/// dtype and shape. Throws xserv::Error naming the peer, the tensor and both shapes.
void check_boundary(const Named& got, const std::vector<BoundaryTensor>& want,
                    const std::string& peer);

} // namespace xserv::engine::pipeline
