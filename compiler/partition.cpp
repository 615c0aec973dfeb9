// partition_pipeline(): layer ranges by a min-max split over per-layer costs, then one graph per
// stage with send/recv at the boundaries.
#include "compiler/partition.h"

#include <algorithm>
#include <climits>
#include <limits>
#include <map>
#include <regex>

#include <fmt/format.h>

#include "base/error.h"

namespace xserv::compiler {

namespace {

using ir::Node;
using ir::Op;
using ir::ValueId;

constexpr int kNone = INT_MIN; ///< params: copied into every stage that reads them
constexpr int kPre = -1;       ///< before the first layer: the embedding

/// The layer a weight or cache belongs to by name: N for "model.layers.N.", kPre for the
/// embedding, `layers` (the head) for anything else (final norm, lm_head).
int unit_of_name(const std::string& name, int layers) {
  static const std::regex layer(R"(^model\.layers\.(\d+)\.)");
  std::smatch m;
  if (std::regex_search(name, m, layer))
    return std::stoi(m[1].str());
  if (name.find("embed") != std::string::npos)
    return kPre;
  return layers;
}

int count_layers(const ir::Graph& g) {
  int layers = 0;
  for (const Node& n : g.nodes)
    if (n.op == Op::Weight || n.op == Op::Cache) {
      const int u = unit_of_name(n.attr_str("name"), INT_MAX);
      if (u != INT_MAX && u != kPre)
        layers = std::max(layers, u + 1);
    }
  return layers;
}

int64_t static_numel(const ir::Type& t) {
  int64_t n = 1;
  for (const ir::Dim& d : t.shape)
    n *= d.is_static() ? d.size : 0;
  return n;
}

/// Per-unit costs: index 0 is kPre, 1..L the layers, L+1 the head.
struct UnitCost {
  int64_t weight_bytes = 0, decode_bytes = 0;
  double prefill_flops = 0;
};

} // namespace

Partition partition_pipeline(const ir::Graph& g, int stages, const ir::DimBindings& dims,
                             const PartitionCostModel& model) {
  const int layers = count_layers(g);
  if (layers == 0)
    throw Error("pipeline partition: the graph has no decoder layers (weights named "
                "model.layers.N.*)");
  if (stages < 1 || stages > layers)
    throw Error(fmt::format("cannot split {} layers into {} pipeline stages: --pp must be 1 to {}",
                            layers, stages, layers));
  for (const Node& n : g.nodes)
    if (n.op == Op::Send || n.op == Op::Recv)
      throw Error("pipeline partition: the graph is already partitioned (it has send/recv)");

  // 1. Each node's unit: weights and caches by name, params none, the rest the latest operand.
  const size_t count = g.size();
  std::vector<int> unit(count, kNone);
  std::vector<std::vector<ValueId>> users(count);
  for (size_t i = 0; i < count; ++i) {
    const Node& n = g.nodes[i];
    for (ValueId in : n.inputs)
      users[static_cast<size_t>(in)].push_back(static_cast<ValueId>(i));
    if (n.op == Op::Param)
      continue;
    if (n.op == Op::Weight || n.op == Op::Cache) {
      unit[i] = unit_of_name(n.attr_str("name"), layers);
      continue;
    }
    int u = kNone;
    for (ValueId in : n.inputs)
      u = std::max(u, unit[static_cast<size_t>(in)]);
    unit[i] = u == kNone ? kPre : u;
  }

  // 2. Costs per unit from the weights (experts count k / E of their bytes per token).
  std::vector<UnitCost> cost(static_cast<size_t>(layers) + 2);
  std::vector<int64_t> kv_bytes(static_cast<size_t>(layers) + 2, 0);
  auto slot = [&](int u) -> size_t { return static_cast<size_t>(u + 1); };
  for (size_t i = 0; i < count; ++i) {
    const Node& n = g.nodes[i];
    if (n.op == Op::Cache) {
      try {
        int64_t bytes = n.type().dtype == ir::DType::F32 ? 4 : 2;
        for (int64_t d : ir::concrete(n.type().shape, dims))
          bytes *= d;
        kv_bytes[slot(unit[i])] += bytes;
      } catch (const Error&) { // rows or slots unbound: no KV figure
      }
      continue;
    }
    if (n.op != Op::Weight)
      continue;
    const int64_t numel = static_numel(n.type());
    const bool mx = n.type().dtype == ir::DType::MXFP4;
    const int64_t bytes = mx ? static_cast<int64_t>(double(numel) * model.mxfp4_held_bytes)
                             : numel * (n.type().dtype == ir::DType::F32 ? 4 : 2);
    const int64_t read = mx ? static_cast<int64_t>(double(numel) * model.mxfp4_read_bytes) : bytes;
    double fraction = 1.0;
    for (ValueId u : users[i]) {
      const Node& user = g.node(u);
      if (user.op == Op::MoeExperts || user.op == Op::MoeExpertsResidual) {
        const ir::Type& ids = g.type(user.inputs[2]);
        const double k = double(ids.shape.at(1).size), e = double(n.type().shape.at(0).size);
        fraction = k / e;
      }
    }
    UnitCost& c = cost[slot(unit[i])];
    c.weight_bytes += bytes;
    const bool embedding = unit[i] == kPre;
    c.decode_bytes += embedding ? 0 : static_cast<int64_t>(double(read) * fraction);
    if (n.type().shape.size() >= 2 && !embedding && unit[i] != layers)
      c.prefill_flops += 2.0 * double(numel) * fraction;
  }
  auto seconds = [&](const UnitCost& c) {
    return double(c.decode_bytes) / model.bytes_per_s + c.prefill_flops / model.flops_per_s;
  };

  // 3. Min-max split of the layers into contiguous ranges (the first range also pays for the
  // embedding, the last for the head): best[s][j] = the least possible maximum over stages
  // 0..s-1 covering layers 0..j-1.
  std::vector<double> prefix(static_cast<size_t>(layers) + 1, 0);
  for (int l = 0; l < layers; ++l)
    prefix[static_cast<size_t>(l) + 1] = prefix[static_cast<size_t>(l)] + seconds(cost[slot(l)]);
  const double pre = seconds(cost[slot(kPre)]), head = seconds(cost[slot(layers)]);
  auto range_cost = [&](int s, int a, int b) { // stage s holds layers a..b-1
    return prefix[static_cast<size_t>(b)] - prefix[static_cast<size_t>(a)] + (s == 0 ? pre : 0) +
           (s == stages - 1 ? head : 0);
  };
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(static_cast<size_t>(stages) + 1,
                                        std::vector<double>(static_cast<size_t>(layers) + 1, inf));
  std::vector<std::vector<int>> cut(best.size(), std::vector<int>(best[0].size(), 0));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s)
    for (int j = s; j <= layers; ++j)
      for (int i = s - 1; i < j; ++i) {
        const double c = std::max(best[size_t(s - 1)][size_t(i)], range_cost(s - 1, i, j));
        if (c < best[size_t(s)][size_t(j)]) {
          best[size_t(s)][size_t(j)] = c;
          cut[size_t(s)][size_t(j)] = i;
        }
      }
  std::vector<int> first(static_cast<size_t>(stages) + 1,
                         layers); // stage s: first[s]..first[s+1]-1
  for (int s = stages, j = layers; s >= 1; --s) {
    first[size_t(s)] = j;
    j = cut[size_t(s)][size_t(j)];
  }
  first[0] = 0;
  auto stage_of_unit = [&](int u) {
    if (u == kPre)
      return 0;
    if (u >= layers)
      return stages - 1;
    int s = 0;
    while (u >= first[size_t(s) + 1])
      ++s;
    return s;
  };

  // 4. Which stages read each value (params excluded: every stage has its own copy).
  std::vector<int> stage(count, -1), last_use(count, -1);
  for (size_t i = 0; i < count; ++i)
    if (unit[i] != kNone)
      stage[i] = stage_of_unit(unit[i]);
  for (size_t i = 0; i < count; ++i)
    for (ValueId in : g.nodes[i].inputs)
      last_use[size_t(in)] = std::max(last_use[size_t(in)], stage[i]);
  for (ValueId o : g.outputs)
    if (stage[size_t(o)] != stages - 1)
      throw Error(fmt::format("pipeline partition: output %{} is computed by stage {}, not the "
                              "last one",
                              o, stage[size_t(o)]));

  // 5. One graph per stage.
  Partition p;
  p.stages.resize(static_cast<size_t>(stages));
  p.info.resize(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    ir::Graph& ng = p.stages[size_t(s)];
    StageInfo& info = p.info[size_t(s)];
    std::map<ValueId, ValueId> local;
    auto add = [&](Node n) {
      ng.nodes.push_back(std::move(n));
      return static_cast<ValueId>(ng.nodes.size() - 1);
    };
    auto name_of = [](ValueId v) { return fmt::format("act.{}", v); };
    auto recv = [&](ValueId v) { // a value of an earlier stage arrives from stage s - 1
      Node n;
      n.op = Op::Recv;
      n.set_attr("name", name_of(v));
      n.set_attr("peer", int64_t{s - 1});
      n.types = {g.type(v)};
      ++info.recvs;
      return local[v] = add(std::move(n));
    };
    auto operand = [&](ValueId v) -> ValueId {
      if (auto it = local.find(v); it != local.end())
        return it->second;
      if (unit[size_t(v)] == kNone) // a param: this stage's own copy
        return local[v] = add(g.node(v));
      XSERV_CHECK(stage[size_t(v)] < s, "pipeline partition: operand from a later stage");
      return recv(v);
    };
    for (size_t i = 0; i < count; ++i) {
      if (stage[i] != s)
        continue;
      Node n = g.nodes[i];
      for (ValueId& in : n.inputs)
        in = operand(in);
      local[static_cast<ValueId>(i)] = add(std::move(n));
    }
    // Values a later stage reads: sent on (received first when they only pass through).
    std::vector<ValueId> sends;
    for (size_t i = 0; i < count; ++i) {
      const ValueId v = static_cast<ValueId>(i);
      if (unit[i] == kNone || stage[i] > s || last_use[i] <= s)
        continue;
      Node n;
      n.op = Op::Send;
      n.inputs = {operand(v)};
      n.set_attr("name", name_of(v));
      n.set_attr("peer", int64_t{s + 1});
      n.types = {g.type(v)};
      sends.push_back(add(std::move(n)));
      ++info.sends;
    }
    if (s == stages - 1)
      for (ValueId o : g.outputs)
        ng.outputs.push_back(local.at(o));
    else
      ng.outputs = sends;
    ir::verify_or_throw(ng, fmt::format("of pipeline stage {}", s));

    info.first_layer = first[size_t(s)];
    info.last_layer = first[size_t(s) + 1] - 1;
    info.embedding = s == 0;
    info.head = s == stages - 1;
    for (int u = kPre; u <= layers; ++u)
      if (stage_of_unit(u) == s &&
          (u == kPre || u == layers || (u >= info.first_layer && u <= info.last_layer))) {
        const UnitCost& c = cost[slot(u)];
        info.weight_bytes += c.weight_bytes;
        info.decode_bytes += c.decode_bytes;
        info.prefill_flops += c.prefill_flops;
        info.kv_bytes += kv_bytes[slot(u)];
      }
    info.decode_seconds = double(info.decode_bytes) / model.bytes_per_s;
    info.prefill_seconds = info.prefill_flops / model.flops_per_s;
    info.cost = info.decode_seconds + info.prefill_seconds;
  }
  double worst = 0, total = 0;
  for (const StageInfo& i : p.info) {
    worst = std::max(worst, i.cost);
    total += i.cost;
  }
  p.imbalance = total > 0 ? worst / (total / stages) - 1.0 : 0.0;
  return p;
}

std::string describe(const Partition& p) {
  std::string s;
  for (size_t i = 0; i < p.info.size(); ++i) {
    const StageInfo& in = p.info[i];
    s += fmt::format("stage {}: layers {}..{}{}{}, weights {:.2f} GB, KV {:.2f} GB, decode "
                     "{:.3f} ms/token, prefill {:.2f} us/token, {} send(s), {} recv(s)\n",
                     i, in.first_layer, in.last_layer, in.embedding ? " + embedding" : "",
                     in.head ? " + head" : "", double(in.weight_bytes) / 1e9,
                     double(in.kv_bytes) / 1e9, in.decode_seconds * 1e3, in.prefill_seconds * 1e6,
                     in.sends, in.recvs);
  }
  s += fmt::format("imbalance {:.1f}% (most expensive stage over the mean)\n", p.imbalance * 100);
  return s;
}

} // namespace xserv::compiler
