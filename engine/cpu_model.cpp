// CpuModel: checkpoint weights decoded to fp32 on first use, then the interpreter per step.
#include "engine/cpu_model.h"

#include <map>

#include <fmt/format.h>

#include "base/error.h"
#include "models/gpt_oss.h"

namespace xserv::engine {

CpuModel::CpuModel(const std::filesystem::path& model_dir, int64_t max_batch, int64_t max_seq,
                   const ir::Graph* graph, std::vector<ir::Graph> stages)
    : ckpt_(models::Checkpoint::open(model_dir, {.map_data = true, .validate = true})),
      max_batch_(max_batch), max_seq_(max_seq) {
  graph_ = graph ? *graph : models::build_gpt_oss(ckpt_.config());
  ir::verify_or_throw(graph_, "given to the CPU engine");
  for (size_t i = 0; i < stages.size(); ++i)
    ir::verify_or_throw(stages[i], fmt::format("of pipeline stage {}", i));
  stages_ = std::move(stages);
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
  env_.dims = {{ir::dims::kCacheRows, max_batch_}, {ir::dims::kMaxSeq, max_seq_}};
}

std::vector<ir::Tensor> CpuModel::run_graph(const ir::Graph& g,
                                            std::map<std::string, ir::Tensor> params) {
  env_.params = std::move(params);
  return ir::interpret(g, env_);
}

std::vector<std::vector<float>> CpuModel::step(const models::StepInput& in) {
  if (static_cast<int64_t>(in.tokens.size()) > max_batch_)
    throw Error(fmt::format("{} sequences in one step exceed the maximum batch of {}",
                            in.tokens.size(), max_batch_));
  env_.params = models::step_params(in);
  std::vector<ir::Tensor> out =
      stages_.empty() ? ir::interpret(graph_, env_) : ir::interpret_stages(stages_, env_);
  return sequence_logits(out.at(0), in.tokens.size(), env_.params.at(models::params::kLogitRows));
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
