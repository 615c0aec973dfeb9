// interpret(): runs any graph on the CPU in fp32, the reference every pass and kernel is held to.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "ir/graph.h"
#include "ir/reference.h"
#include "ir/tensor.h"

namespace xserv::ir {

/// Supplies checkpoint tensors by name, as fp32 tensors of the declared logical shape (MXFP4
/// weights decoded). Called once per weight node per interpret() call; implementations cache.
using WeightProvider =
    std::function<std::shared_ptr<const Tensor>(const std::string& name, const Type& type)>;

/// Everything a run needs from outside the graph.
struct InterpretEnv {
  std::map<std::string, Tensor> params; ///< by param name
  WeightProvider weights;
  /// KV caches by name, created zero-filled on first use. Persist across calls so a decode
  /// step sees what prefill wrote.
  std::map<std::string, std::shared_ptr<Tensor>> state;
  /// Values of dynamic dims not determined by the params (cache rows N, cache slots S).
  DimBindings dims;
};

/// Runs the graph and returns its outputs. Dynamic dims are bound from the params' shapes
/// (checked for consistency) and env.dims. Throws xserv::Error for bad inputs (missing param,
/// shape or dtype mismatch, token id out of range, ...).
std::vector<Tensor> interpret(const Graph& g, InterpretEnv& env);

/// Runs pipeline stages one after another in the interpreter, each stage's sends handed to the
/// next stage's recvs (the CPU's transport); `env.state` carries the KV caches of every stage
/// across calls. Returns the last stage's outputs.
std::vector<Tensor> interpret_stages(const std::vector<Graph>& stages, InterpretEnv& env);

/// A weight provider that draws every weight from a seeded normal distribution (norm weights
/// around 1), for tests of graphs whose values need only be finite and reproducible.
WeightProvider random_weights(uint64_t seed, float std = 0.05f);

/// Random params for every param node of `g`, with dims from `dims` (T, B, ...): float params
/// normal, integer params uniform in [0, int_hi).
std::map<std::string, Tensor> random_params(const Graph& g, const DimBindings& dims, uint64_t seed,
                                            int32_t int_hi = 8);

/// The YaRN parameters of a rope_yarn or qkv_rope node's attributes.
ref::Yarn yarn_of(const Node& n);

/// Relative L2 distance ||a - b|| / ||b|| over float tensors (0 when both are zero).
double rel_l2(const Tensor& a, const Tensor& b);

} // namespace xserv::ir

namespace xserv::ir {

/// Runs `a` and `b` on the same inputs, weights and initial cache state (each on its own copy)
/// and compares every output and every cache both runs leave (the same cache names, the same
/// contents): floats within `rtol` relative L2, or bitwise equal when `rtol` is 0; integers
/// equal. Returns "" when they agree, else which output or cache differs and by how much.
std::string compare_runs(const Graph& a, const Graph& b, const InterpretEnv& env, double rtol);

} // namespace xserv::ir
