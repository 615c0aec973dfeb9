// CpuModel: checkpoint weights decoded to fp32 on first use, then the interpreter per step.
#include "engine/cpu_model.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "base/error.h"
#include "engine/step_split.h"
#include "models/gpt_oss.h"

namespace xserv::engine {

CpuModel::CpuModel(const std::filesystem::path& model_dir, int64_t max_batch, int64_t max_seq,
                   const ir::Graph* graph, std::vector<ir::Graph> stages, int64_t kv_blocks,
                   int64_t window_blocks)
    : ckpt_(models::Checkpoint::open(model_dir, {.map_data = true, .validate = true})),
      max_batch_(max_batch), max_seq_(max_seq) {
  graph_ = graph ? *graph : models::build_gpt_oss(ckpt_.config());
  ir::verify_or_throw(graph_, "given to the CPU engine");
  for (size_t i = 0; i < stages.size(); ++i)
    ir::verify_or_throw(stages[i], fmt::format("of pipeline stage {}", i));
  stages_ = std::move(stages);
  // Logits of every token: the graph selects no rows (it reads no logit_rows parameter).
  all_rows_ = stages_.empty() &&
              std::none_of(graph_.nodes.begin(), graph_.nodes.end(), [](const ir::Node& n) {
                return n.op == ir::Op::Param && n.has_attr("name") &&
                       n.attr_str("name") == models::params::kLogitRows;
              });
  auto cache = std::make_shared<std::map<std::string, std::shared_ptr<const ir::Tensor>>>();
  const models::Checkpoint* ck = &ckpt_;
  env_.weights = [ck, cache](const std::string& name,
                             const ir::Type& type) -> std::shared_ptr<const ir::Tensor> {
    if (auto it = cache->find(name); it != cache->end())
      return it->second;
    std::vector<int64_t> shape;
    for (const auto& d : type.shape)
      shape.push_back(d.size);
    std::vector<float> data =
        type.dtype == ir::DType::MXFP4 ? ck->decode_mxfp4(name) : ck->read_bf16(name);
    int64_t numel = 1;
    for (int64_t s : shape)
      numel *= s;
    if (static_cast<int64_t>(data.size()) != numel)
      throw Error(fmt::format("weight '{}' has {} values, the graph expects {} ({})", name,
                              data.size(), numel, ir::type_str(type)));
    auto t = std::make_shared<const ir::Tensor>(ir::Tensor::from_floats(shape, std::move(data)));
    (*cache)[name] = t;
    return t;
  };
  // The paging of the caches: the graph's, or every stage's (one without sliding layers has no
  // window, one without layers no caches).
  kv_ = models::kv_geometry(graph_, max_seq_);
  if (!stages_.empty()) {
    kv_.window = 0;
    for (const ir::Graph& s : stages_) {
      const models::KvGeometry k = models::kv_geometry(s, max_seq_);
      kv_.window = std::max(kv_.window, k.window);
      if (std::any_of(s.nodes.begin(), s.nodes.end(),
                      [](const ir::Node& n) { return n.op == ir::Op::Cache; })) {
        kv_.block_size = k.block_size;
        kv_.table_blocks = k.table_blocks;
      }
    }
  }
  // Which caches page from the window pool, and one block's bytes in each pool (fp32).
  uint64_t full_block_bytes = 0, window_block_bytes = 0;
  auto note_caches = [&](const ir::Graph& g) {
    for (const ir::Node& n : g.nodes) {
      if (n.op != ir::Op::Cache)
        continue;
      const auto& shape = n.type().shape;
      const bool window = !shape.empty() && shape[0].name == ir::dims::kWindowBlocks;
      window_cache_[n.attr_str("name")] = window;
      uint64_t bytes = 4;
      for (size_t i = 1; i < shape.size(); ++i)
        bytes *= uint64_t(shape[i].is_static() ? shape[i].size : 1);
      (window ? window_block_bytes : full_block_bytes) += bytes;
    }
  };
  if (stages_.empty())
    note_caches(graph_);
  for (const ir::Graph& s : stages_)
    note_caches(s);
  // The pools: as asked, else max_batch sequences of max_seq positions within kHostKvBytes
  // (at least one sequence), and the null block.
  constexpr uint64_t kHostKvBytes = uint64_t(256) << 20;
  int64_t fit = max_batch_;
  if (full_block_bytes > 0)
    fit = std::clamp<int64_t>(
        int64_t(kHostKvBytes /
                (full_block_bytes * uint64_t(std::max<int64_t>(kv_.table_blocks, 1)))),
        1, max_batch_);
  kv_.blocks = kv_blocks > 0 ? kv_blocks : fit * kv_.table_blocks + 1;
  kv_.window_blocks = kv_.window == 0     ? 0
                      : window_blocks > 0 ? window_blocks
                                          : 2 * fit * kv_.ring_blocks() + 1;
  env_.dims = {{ir::dims::kKvBlocks, kv_.blocks},
               {ir::dims::kWindowBlocks, std::max<int64_t>(kv_.window_blocks, 1)},
               {ir::dims::kMaxSeq, max_seq_}};
}

void CpuModel::copy_blocks(const std::vector<models::StepInput::BlockCopy>& copies) {
  for (const models::StepInput::BlockCopy& c : copies)
    for (auto& [name, t] : env_.state) {
      const auto w = window_cache_.find(name);
      if (!t || w == window_cache_.end() || w->second != c.window)
        continue;
      const int64_t per = t->numel() / t->dim(0);
      std::copy_n(t->f.begin() + c.src * per, per, t->f.begin() + c.dst * per);
    }
}

std::vector<ir::Tensor> CpuModel::run_graph(const ir::Graph& g,
                                            std::map<std::string, ir::Tensor> params) {
  env_.params = std::move(params);
  return ir::interpret(g, env_);
}

std::vector<ir::Tensor> CpuModel::run_step(const models::StepInput& in) {
  validate_step(in, max_batch_, max_seq_, ckpt_.config().vocab_size, kv_);
  copy_blocks(in.copies);
  env_.params = models::step_params(in);
  return stages_.empty() ? ir::interpret(graph_, env_) : ir::interpret_stages(stages_, env_);
}

std::vector<std::vector<float>> CpuModel::step(const models::StepInput& in) {
  const std::vector<ir::Tensor> out = run_step(in);
  return sequence_logits(out.at(0), in.tokens.size(), env_.params.at(models::params::kLogitRows));
}

std::vector<std::vector<float>> CpuModel::step_all(const models::StepInput& in) {
  if (!all_rows_)
    return Model::step_all(in); // throws
  const ir::Tensor logits = run_step(in).at(0);
  const int64_t v = logits.shape.back(), rows = logits.numel() / v;
  std::vector<std::vector<float>> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    out[size_t(r)].assign(logits.f.begin() + r * v, logits.f.begin() + (r + 1) * v);
  return out;
}

std::vector<std::vector<float>> sequence_logits(const ir::Tensor& logits, size_t seqs,
                                                const ir::Tensor& logit_rows) {
  const int64_t v = logits.shape.back(), rows = logits.numel() / v;
  // A graph compiled with --all-logits returns every token's row: keep each sequence's last.
  const bool per_token = rows != static_cast<int64_t>(seqs);
  std::vector<std::vector<float>> result(seqs);
  for (size_t b = 0; b < seqs; ++b) {
    const int64_t r = per_token ? logit_rows.i[b] : static_cast<int64_t>(b);
    result[b].assign(logits.f.begin() + r * v, logits.f.begin() + (r + 1) * v);
  }
  return result;
}

} // namespace xserv::engine
