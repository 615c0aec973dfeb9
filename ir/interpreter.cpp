// interpret(): walks the nodes in order, dispatching each op to its reference math.
#include "ir/interpreter.h"

#include <cmath>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "base/error.h"
#include "ir/reference.h"

namespace xserv::ir {
namespace {

using TensorPtr = std::shared_ptr<const Tensor>;

void bind_dims(const Shape& declared, const Tensor& actual, const std::string& what,
               DimBindings& dims) {
  if (declared.size() != actual.shape.size())
    throw Error(fmt::format("{}: expected rank {} ({}), got rank {}", what, declared.size(),
                            shape_str(declared), actual.shape.size()));
  for (size_t k = 0; k < declared.size(); ++k) {
    const Dim& d = declared[k];
    const int64_t got = actual.shape[k];
    if (d.is_static()) {
      if (d.size != got)
        throw Error(fmt::format("{}: dimension {} is {}, expected {}", what, k, got, d.size));
      continue;
    }
    auto [it, fresh] = dims.try_emplace(d.name, got);
    if (!fresh && it->second != got)
      throw Error(fmt::format("{}: dimension {} is {}, but {} = {} elsewhere", what, d.name, got,
                              d.name, it->second));
  }
}

TensorPtr make(Tensor t) {
  return std::make_shared<const Tensor>(std::move(t));
}

Tensor cast(const Tensor& x, DType to) {
  Tensor t = x;
  if (is_float(to) && t.is_int()) {
    t.f.assign(t.i.begin(), t.i.end());
    t.i.clear();
  } else if (!is_float(to) && !t.is_int()) {
    t.i.reserve(t.f.size());
    for (float v : t.f)
      t.i.push_back(static_cast<int32_t>(v));
    t.f.clear();
  }
  t.dtype = to;
  return t;
}

/// Results of one node (several for multi-result ops).
using Results = std::vector<TensorPtr>;

Results eval_node(const Graph& g, size_t i, const std::vector<Results>& val, InterpretEnv& env,
                  DimBindings& dims) {
  const Node& n = g.nodes[i];
  auto in = [&](size_t k) -> const Tensor& { return *val[static_cast<size_t>(n.inputs[k])][0]; };
  switch (n.op) {
  case Op::Param:
    return {make(env.params.at(n.attr_str("name")))};
  case Op::Recv: { // a pipeline driver passes what the previous stage sent as a param
    auto it = env.params.find(n.attr_str("name"));
    if (it == env.params.end())
      throw Error(fmt::format("recv '{}': nothing was sent from stage {}", n.attr_str("name"),
                              n.attr_int("peer")));
    return {make(it->second)};
  }
  case Op::Send:
    return {val[static_cast<size_t>(n.inputs[0])][0]};
  case Op::Weight: {
    XSERV_CHECK(env.weights != nullptr, "interpret() needs a weight provider");
    TensorPtr w = env.weights(n.attr_str("name"), n.type());
    bind_dims(n.type().shape, *w, "weight '" + n.attr_str("name") + "'", dims);
    return {w};
  }
  case Op::Cache: {
    auto& slot = env.state[n.attr_str("name")];
    std::vector<int64_t> shape = concrete(n.type().shape, dims);
    if (!slot || slot->shape != shape)
      slot = std::make_shared<Tensor>(Tensor::zeros(DType::F32, shape));
    return {slot};
  }
  case Op::Embedding:
    return {make(ref::embedding(in(0), in(1)))};
  case Op::RmsNorm:
    return {make(ref::rms_norm(in(0), in(1), n.attr_float("eps")))};
  case Op::Linear:
    return {make(ref::linear(in(0), in(1), n.inputs.size() == 3 ? &in(2) : nullptr))};
  case Op::Add:
    return {make(ref::add(in(0), in(1)))};
  case Op::Reshape: {
    Tensor t = in(0);
    t.shape = concrete(n.type().shape, dims);
    return {make(std::move(t))};
  }
  case Op::Cast:
    return {make(cast(in(0), n.type().dtype))};
  case Op::RopeYarn:
    return {make(ref::rope_yarn(in(0), in(1), yarn_of(n)))};
  case Op::Attention: {
    ref::Batch b{in(6), in(7), in(8), in(9)};
    return {make(ref::attention(in(0), in(1), in(2), in(3), in(4), in(5), b, n.attr_int("window"),
                                n.attr_float("scale")))};
  }
  case Op::KvWrite: {
    // The cache node's value is the live state tensor; kv_write mutates it in place, so every
    // later reader (in node order) sees the write.
    auto cache = std::const_pointer_cast<Tensor>(val[static_cast<size_t>(n.inputs[0])][0]);
    Tensor no_ctx = Tensor::zeros(DType::I32, {in(4).dim(0)});
    ref::Batch b{in(2), in(3), no_ctx, in(4)};
    ref::kv_write(*cache, in(1), b, n.has_attr("window") ? n.attr_int("window") : 0);
    return {cache};
  }
  case Op::RouterTopK: {
    Tensor w, ids;
    ref::router_topk(in(0), n.attr_int("k"), w, ids);
    return {make(std::move(w)), make(std::move(ids))};
  }
  case Op::Extract:
    return {val[static_cast<size_t>(n.inputs[0])].at(static_cast<size_t>(n.attr_int("index")))};
  case Op::MoeExperts:
    return {make(ref::moe_experts(in(0), in(1), in(2), in(3), in(4), in(5), in(6),
                                  n.attr_float("limit"), n.attr_float("alpha")))};
  case Op::SelectRows:
    return {make(ref::select_rows(in(0), in(1)))};
  case Op::Argmax:
    return {make(ref::argmax(in(0)))};
  case Op::RmsNormLinear:
    return {make(ref::rms_norm_linear(in(0), in(1), n.attr_float("eps"), in(2),
                                      n.inputs.size() == 4 ? &in(3) : nullptr))};
  case Op::QkvRope: {
    ref::Qkv r = ref::qkv_rope(in(0), in(1), n.attr_float("eps"), in(2), in(3), in(4), in(5), in(6),
                               in(7), in(8), n.attr_int("head_dim"), yarn_of(n));
    return {make(std::move(r.q)), make(std::move(r.k)), make(std::move(r.v))};
  }
  case Op::LinearResidual: // the residual is the last operand, the bias optional before it
    return {make(ref::linear_residual(in(0), in(1), n.inputs.size() == 4 ? &in(2) : nullptr,
                                      in(n.inputs.size() - 1)))};
  case Op::Router: {
    Tensor w, ids;
    ref::router(in(0), in(1), n.inputs.size() == 3 ? &in(2) : nullptr, n.attr_int("k"), w, ids);
    return {make(std::move(w)), make(std::move(ids))};
  }
  case Op::MoeExpertsResidual:
    return {make(ref::moe_experts_residual(in(0), in(1), in(2), in(3), in(4), in(5), in(6), in(7),
                                           n.attr_float("limit"), n.attr_float("alpha")))};
  }
  XSERV_CHECK(false, "interpret: unhandled op " + print_node(g, static_cast<ValueId>(i)));
}

} // namespace

std::vector<Tensor> interpret(const Graph& g, InterpretEnv& env) {
  DimBindings dims = env.dims;
  // Bind dynamic dims from the params first so every later shape resolves.
  for (const Node& n : g.nodes) {
    if (n.op != Op::Param)
      continue;
    const std::string& name = n.attr_str("name");
    auto it = env.params.find(name);
    if (it == env.params.end())
      throw Error(fmt::format("missing input '{}' ({})", name, type_str(n.type())));
    if (is_float(n.type().dtype) != is_float(it->second.dtype))
      throw Error(fmt::format("input '{}' must be {}", name, type_str(n.type())));
    bind_dims(n.type().shape, it->second, "input '" + name + "'", dims);
  }
  std::vector<Results> val(g.size());
  for (size_t i = 0; i < g.size(); ++i)
    val[i] = eval_node(g, i, val, env, dims);
  std::vector<Tensor> out;
  for (ValueId o : g.outputs)
    out.push_back(*val[static_cast<size_t>(o)][0]);
  return out;
}

WeightProvider random_weights(uint64_t seed, float stddev) {
  auto cache = std::make_shared<std::map<std::string, TensorPtr>>();
  return [seed, stddev, cache](const std::string& name, const Type& type) -> TensorPtr {
    if (auto it = cache->find(name); it != cache->end())
      return it->second;
    std::vector<int64_t> shape;
    for (const Dim& d : type.shape) {
      XSERV_CHECK(d.is_static(), "random_weights: weight '" + name + "' has a dynamic dim");
      shape.push_back(d.size);
    }
    Tensor t = Tensor::zeros(is_float(type.dtype) ? DType::F32 : DType::I32, shape);
    std::mt19937_64 rng(seed ^ std::hash<std::string>{}(name));
    std::normal_distribution<float> nd(0.0f, stddev);
    // Norm weights (1-D, named *norm*) sit around 1 as in trained models.
    const bool is_norm = name.find("norm") != std::string::npos;
    for (float& v : t.f)
      v = (is_norm ? 1.0f : 0.0f) + nd(rng);
    auto p = make(std::move(t));
    (*cache)[name] = p;
    return p;
  };
}

std::map<std::string, Tensor> random_params(const Graph& g, const DimBindings& dims, uint64_t seed,
                                            int32_t int_hi) {
  std::map<std::string, Tensor> out;
  std::mt19937_64 rng(seed);
  for (const Node& n : g.nodes) {
    if (n.op != Op::Param)
      continue;
    Tensor t = Tensor::zeros(n.type().dtype, concrete(n.type().shape, dims));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_int_distribution<int32_t> ud(0, int_hi - 1);
    for (float& v : t.f)
      v = nd(rng);
    for (int32_t& v : t.i)
      v = ud(rng);
    out[n.attr_str("name")] = std::move(t);
  }
  return out;
}

double rel_l2(const Tensor& a, const Tensor& b) {
  XSERV_CHECK(a.f.size() == b.f.size(), "rel_l2 of tensors of different sizes");
  double num = 0, den = 0;
  for (size_t i = 0; i < a.f.size(); ++i) {
    double d = static_cast<double>(a.f[i]) - b.f[i];
    num += d * d;
    den += static_cast<double>(b.f[i]) * b.f[i];
  }
  if (den == 0)
    return num == 0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}

} // namespace xserv::ir

namespace xserv::ir {

namespace {

/// "" when `a` and `b` agree (same shape and kind; integers equal; floats bitwise equal when
/// rtol is 0, else within rtol relative L2), else what differs, prefixed by `what`.
std::string compare_tensors(const Tensor& a, const Tensor& b, double rtol,
                            const std::string& what) {
  if (a.shape != b.shape)
    return fmt::format("{}: shapes differ", what);
  if (a.is_int() != b.is_int())
    return fmt::format("{}: element kinds differ", what);
  if (a.is_int())
    return a.i == b.i ? "" : fmt::format("{}: integer values differ", what);
  if (rtol == 0) {
    for (size_t k = 0; k < a.f.size(); ++k)
      if (std::memcmp(&a.f[k], &b.f[k], sizeof(float)) != 0)
        return fmt::format("{}: element {} differs ({} vs {}), expected bitwise equal", what, k,
                           a.f[k], b.f[k]);
    return "";
  }
  double err = rel_l2(a, b);
  if (!(err <= rtol))
    return fmt::format("{}: relative L2 {:.3g} > {:.3g}", what, err, rtol);
  return "";
}

} // namespace

std::string compare_runs(const Graph& a, const Graph& b, const InterpretEnv& env, double rtol) {
  auto run = [&](const Graph& g, InterpretEnv& copy) {
    copy = env;
    for (auto& [name, t] : copy.state)
      t = std::make_shared<Tensor>(*t);
    return interpret(g, copy);
  };
  InterpretEnv ea, eb;
  std::vector<Tensor> ra = run(a, ea), rb = run(b, eb);
  if (ra.size() != rb.size())
    return fmt::format("{} outputs vs {}", ra.size(), rb.size());
  for (size_t i = 0; i < ra.size(); ++i)
    if (std::string d = compare_tensors(ra[i], rb[i], rtol, fmt::format("output {}", i));
        !d.empty())
      return d;
  // The caches each run left behind: a dropped, duplicated or misrouted kv_write shows here
  // even when this step's outputs do not read it.
  for (const auto& [name, t] : ea.state) {
    auto it = eb.state.find(name);
    if (it == eb.state.end())
      return fmt::format("cache '{}' written by the first graph only", name);
    if (std::string d = compare_tensors(*t, *it->second, rtol, "cache '" + name + "'"); !d.empty())
      return d;
  }
  for (const auto& [name, t] : eb.state)
    if (!ea.state.count(name))
      return fmt::format("cache '{}' written by the second graph only", name);
  return "";
}

} // namespace xserv::ir

namespace xserv::ir {

ref::Yarn yarn_of(const Node& n) {
  ref::Yarn y;
  y.theta = n.attr_float("theta");
  y.factor = n.attr_float("factor");
  y.original_max = n.attr_float("original_max");
  y.beta_fast = n.attr_float("beta_fast");
  y.beta_slow = n.attr_float("beta_slow");
  y.truncate = n.attr_int("truncate") != 0;
  return y;
}

std::vector<Tensor> interpret_stages(const std::vector<Graph>& stages, InterpretEnv& env) {
  std::map<std::string, Tensor> sent;
  std::vector<Tensor> out;
  for (size_t s = 0; s < stages.size(); ++s) {
    for (auto& [name, t] : sent)
      env.params[name] = std::move(t);
    out = interpret(stages[s], env);
    for (const auto& [name, t] : sent)
      env.params.erase(name);
    sent.clear();
    if (s + 1 == stages.size())
      break;
    for (size_t i = 0; i < out.size(); ++i) {
      const Node& n = stages[s].node(stages[s].outputs[i]);
      XSERV_CHECK(n.op == Op::Send, "a pipeline stage other than the last returns its sends");
      sent[n.attr_str("name")] = std::move(out[i]);
    }
  }
  return out;
}

} // namespace xserv::ir
