// StageRunner for the interpreter and for a CudaModel, and the step's micro-batches.
#include "engine/pipeline/stage.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/error.h"
#include "engine/cpu_model.h"
#include "engine/cuda_model.h"
#include "engine/model.h"
#include "engine/step_split.h"
#include "models/gpt_oss.h"
#include "runtime/device.h"
#include "runtime/nccl.h"
#include "runtime/open_plan.h"

namespace xserv::engine::pipeline {
namespace fs = std::filesystem;

Named name_outputs(const ir::Graph& g, std::vector<ir::Tensor> out) {
  Named named;
  for (size_t i = 0; i < out.size(); ++i) {
    const ir::Node& n = g.node(g.outputs[i]);
    named.emplace_back(n.op == ir::Op::Send ? n.attr_str("name") : fmt::format("out.{}", i),
                       std::move(out[i]));
  }
  return named;
}

std::vector<MicroBatch> micro_batches(const models::StepInput& in, int count) {
  size_t total = 0;
  for (const auto& t : in.tokens)
    total += t.size();
  const size_t parts = std::clamp<size_t>(static_cast<size_t>(std::max(count, 1)), 1, total);
  // Part i holds total / parts tokens, one more for the first total % parts.
  auto capacity = [&](size_t i) { return total / parts + (i < total % parts ? 1 : 0); };
  std::vector<MicroBatch> out;
  for (const std::vector<Piece>& pieces : split_step(in, capacity)) {
    MicroBatch mb;
    mb.in = piece_step(in, pieces);
    for (const Piece& p : pieces) {
      mb.seq.push_back(p.seq);
      mb.last.push_back(ends_sequence(in, p));
    }
    out.push_back(std::move(mb));
  }
  return out;
}

namespace {

/// The interpreter over the stage's program.
class CpuStage : public StageRunner {
public:
  CpuStage(const fs::path& model_dir, int64_t max_batch, int64_t max_seq, ir::Graph stage)
      : stage_(std::move(stage)), engine_(model_dir, max_batch, max_seq, nullptr, {stage_}) {}
  const models::ModelConfig& config() const override { return engine_.config(); }
  const models::KvGeometry& kv_geometry() const override { return engine_.kv_geometry(); }
  Named run(const models::StepInput& in, const Named& received) override {
    std::map<std::string, ir::Tensor> params = models::step_params(in);
    for (const auto& [name, t] : received)
      params[name] = t;
    return name_outputs(stage_, engine_.run_graph(stage_, std::move(params)));
  }
  std::vector<int32_t> run_greedy(const models::StepInput& in, const Named& received) override {
    const Named out = run(in, received);
    std::vector<int32_t> ids;
    for (const auto& row : sequence_logits(out.at(0).second, in.tokens.size(),
                                           models::step_params(in).at(models::params::kLogitRows)))
      ids.push_back(engine::greedy_pick(row));
    return ids;
  }
  void reset() override { engine_.reset(); }

private:
  ir::Graph stage_;
  CpuModel engine_;
};

/// A CudaModel over a plan stage's program on this process's GPU; activations cross the host,
/// or go GPU to GPU over NCCL.
class CudaStage : public StageRunner {
public:
  CudaStage(const fs::path& model_dir, runtime::StageProgram program,
            const CudaModelOptions& options)
      : recvs_(program.layout.recvs) {
    if (program.sends.size() > 1)
      throw Error(fmt::format("a pipeline stage on the GPU sends one value, {} sends {}",
                              program.source, program.sends.size()));
    sends_ = program.layout.output.sends;
    if (sends_ && program.sends.empty())
      throw Error(fmt::format("{}: its output is sent on, but it names no send", program.source));
    name_ = sends_ ? program.sends[0].name : "out.0";
    engine_ = std::make_unique<CudaModel>(model_dir, std::move(program), options);
  }
  const models::ModelConfig& config() const override { return engine_->config(); }
  const models::KvGeometry& kv_geometry() const override { return engine_->kv_geometry(); }
  Named run(const models::StepInput& in, const Named& received) override {
    step_tokens_ = token_count(in);
    if (comm_ && sends_) { // sent on to the next rank on the device
      engine_->step_stage_device(in, transport());
      return {};
    }
    const std::vector<std::vector<float>> rows = comm_ ? engine_->step_stage_device(in, transport())
                                                       : engine_->step_stage(in, as_rows(received));
    const int64_t width = rows.empty() ? 0 : static_cast<int64_t>(rows[0].size());
    ir::Tensor t = ir::Tensor::zeros(ir::DType::F32, {static_cast<int64_t>(rows.size()), width});
    for (size_t i = 0; i < rows.size(); ++i)
      std::copy(rows[i].begin(), rows[i].end(), t.f.begin() + static_cast<long>(i) * width);
    return {{name_, std::move(t)}};
  }
  std::vector<int32_t> run_greedy(const models::StepInput& in, const Named& received) override {
    step_tokens_ = token_count(in);
    if (comm_) {
      std::vector<int32_t> ids;
      engine_->step_stage_device(in, transport(), &ids);
      return ids;
    }
    return engine_->step_stage_greedy(in, as_rows(received));
  }
  void reset() override { engine_->reset(); }
  void use_nccl(runtime::NcclComm* comm, int rank, std::chrono::milliseconds timeout) override {
    comm_ = comm;
    rank_ = rank;
    timeout_ = timeout;
  }

private:
  /// Receives from rank - 1 and sends to rank + 1 on the model's stream, over NCCL.
  StageTransport transport() const {
    StageTransport t;
    t.receive = [this](const std::string& name, void* dst, size_t bytes, Stream stream) {
      check_receive(name, bytes);
      comm_->recv(dst, bytes, rank_ - 1, stream, timeout_);
    };
    t.send = [this](const void* src, size_t bytes, Stream stream) {
      comm_->send(src, bytes, rank_ + 1, stream, timeout_);
    };
    t.wait = [this](Stream stream) {
      comm_->wait(
          stream, timeout_,
          fmt::format("a pipelined step (rank {} <-> {} and {})", rank_, rank_ - 1, rank_ + 1));
    };
    return t;
  }

  /// An NCCL receive carries no shape: the bytes the model posts for `name` (a sub-step's rows
  /// of the plan's stage layout) must be whole rows of the boundary value the layout declares,
  /// no more rows than the step has tokens; NCCL refuses a sender that sends more.
  void check_receive(const std::string& name, size_t bytes) const {
    for (const runtime::StageLayout::Recv& r : recvs_) {
      if (r.name != name)
        continue;
      const uint64_t row = r.row_bytes;
      if (row > 0 && bytes % row == 0 && bytes / row <= static_cast<uint64_t>(step_tokens_))
        return;
      throw Error(fmt::format("pipeline rank {}: the NCCL receive of activation '{}' from rank {} "
                              "is {} bytes, not whole rows of the plan's stage boundary f32[{} x "
                              "{} bytes] for this step",
                              rank_, name, rank_ - 1, bytes, step_tokens_, row));
    }
    throw Error(fmt::format("pipeline rank {}: an NCCL receive from rank {} of activation '{}', "
                            "which the plan's stage boundary does not carry",
                            rank_, rank_ - 1, name));
  }

  /// Received tensors [T, ...] fp32 as one row per token.
  static StageInputs as_rows(const Named& received) {
    StageInputs inputs;
    for (const auto& [name, t] : received) {
      const size_t rows = t.shape.empty() ? 0 : static_cast<size_t>(t.shape[0]);
      const size_t width = rows ? t.f.size() / rows : 0;
      auto& r = inputs[name];
      for (size_t i = 0; i < rows; ++i)
        r.emplace_back(t.f.begin() + static_cast<long>(i * width),
                       t.f.begin() + static_cast<long>((i + 1) * width));
    }
    return inputs;
  }

  std::vector<runtime::StageLayout::Recv> recvs_; ///< what the stage receives, by name
  std::unique_ptr<CudaModel> engine_;
  std::string name_;
  bool sends_ = false; ///< not the last stage
  runtime::NcclComm* comm_ = nullptr;
  int rank_ = 0;
  std::chrono::milliseconds timeout_{30000};
  int64_t step_tokens_ = 0; ///< of the step run() is in, for check_receive
};

} // namespace

void StageRunner::use_nccl(runtime::NcclComm*, int, std::chrono::milliseconds) {
  throw Error("NCCL moves activations between GPUs: the CPU backend's pipeline uses TCP");
}

std::unique_ptr<StageRunner> make_cpu_stage(const fs::path& model_dir, int64_t max_batch,
                                            int64_t max_seq, ir::Graph stage) {
  return std::make_unique<CpuStage>(model_dir, max_batch, max_seq, std::move(stage));
}

std::unique_ptr<StageRunner> make_cuda_stage(const fs::path& model_dir,
                                             runtime::StageProgram program,
                                             const CudaModelOptions& options) {
  return std::make_unique<CudaStage>(model_dir, std::move(program), options);
}

std::unique_ptr<StageRunner> make_plan_stage(const runtime::OpenedPlan& plan, size_t stage,
                                             const std::string& backend, int64_t max_batch,
                                             int64_t max_seq, const CudaModelOptions& cuda,
                                             const runtime::RunSettings& settings) {
  const runtime::PlanStage& st = plan.plan->stages.at(stage);
  if (backend == "cpu")
    return make_cpu_stage(plan.model_dir, max_batch, max_seq,
                          ir::parse_file(plan.dir / st.graph, "pipeline stage program"));
  if (backend != "cuda")
    throw Error(fmt::format("pipeline: unknown backend '{}'", backend));
  runtime::check_plan_run(plan, st.layout, max_batch, max_seq, settings);
  return make_cuda_stage(plan.model_dir,
                         runtime::load_stage_program(plan.dir, *plan.plan, stage,
                                                     runtime::probe_device().arch(),
                                                     cuda.cache_dir),
                         cuda);
}

} // namespace xserv::engine::pipeline
