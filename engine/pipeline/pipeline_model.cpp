// The step driver of rank 0: PipelineModel sends each worker the step (token ids, context
// lengths, block tables, block copies) and the activations its stage receives, and gets back what
// it sends on (the last rank: the logits or the greedy ids), over the frames of wire.h and the
// Coordinator's connections; with NCCL the activations go GPU to GPU instead.
#include "engine/pipeline/pipeline_model.h"

#include <algorithm>
#include <cstdio>
#include <mutex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "engine/cpu_model.h"
#include "engine/pipeline/coordinator.h"
#include "engine/pipeline/stage.h"
#include "engine/pipeline/wire.h"
#include "models/gpt_oss.h"
#include "models/step.h"
#include "runtime/device.h"
#include "runtime/nccl.h"

namespace xserv::engine::pipeline {
using namespace wire;

namespace {

class PipelineModel : public Model {
public:
  PipelineModel(const runtime::OpenedPlan& plan, const PipelineOptions& options, int64_t max_batch,
                int64_t max_seq, const CudaModelOptions& cuda, const runtime::RunSettings& settings)
      : plan_(plan), options_(options), max_batch_(max_batch), max_seq_(max_seq) {
    const int world = static_cast<int>(plan_.plan->stages.size());
    std::string why;
    const bool on_gpu = options.backend == "cuda";
    const int gpus = on_gpu ? runtime::probe_device().count : 0;
    const std::string transport =
        resolve_transport(options, world, gpus, on_gpu && runtime::nccl_available(&why), &why);
    const bool nccl = transport == "nccl";
    if (options.transport == "auto" && !nccl && on_gpu)
      std::fprintf(stderr, "[pipeline] activations over TCP: %s\n", why.c_str());
    if (nccl && !on_gpu)
      throw Error("the NCCL transport moves activations between GPUs: it needs --backend cuda");
    Welcome welcome{options.backend, max_batch_, max_seq_,
                    nccl ? runtime::nccl_unique_id() : std::string()};
    coord_ = std::make_unique<Coordinator>(plan_, options_, welcome, gpus);
    coord_->start_heartbeats();
    // Rank 0's own stage loads while the workers load theirs; then each reports ready.
    local_ = make_plan_stage(plan_, 0, options.backend, max_batch_, max_seq_, cuda, settings);
    // Every stage pages its own layers' caches through the same block ids: the engine gets
    // the smallest pools any rank could hold.
    kv_ = local_->kv_geometry();
    for (int r = 1; r < world; ++r) {
      const nlohmann::json ready = coord_->await(r, kReady, nullptr, kMaxControlBytes);
      const auto blocks = ready.find("kv_blocks"), window = ready.find("window_blocks");
      if (blocks == ready.end() || !blocks->is_number_integer() || window == ready.end() ||
          !window->is_number_integer() || blocks->get<int64_t>() < 2 || window->get<int64_t>() < 0)
        coord_->fail(r, Error("its ready message does not say its KV pools"));
      kv_.blocks = std::min(kv_.blocks, blocks->get<int64_t>());
      if (kv_.window > 0 && window->get<int64_t>() > 0)
        kv_.window_blocks = std::min(kv_.window_blocks, window->get<int64_t>());
    }
    if (world > 1 && (kv_.blocks != local_->kv_geometry().blocks ||
                      kv_.window_blocks != local_->kv_geometry().window_blocks))
      std::fprintf(stderr,
                   "[pipeline] the engine pages within the smallest rank's pools: %lld + "
                   "%lld blocks\n",
                   static_cast<long long>(kv_.blocks), static_cast<long long>(kv_.window_blocks));
    if (nccl) { // every rank joins the communicator once its stage is loaded
      comm_ =
          std::make_unique<runtime::NcclComm>(welcome.nccl_id, world, 0, options.connect_timeout);
      comm_->connect_pipeline(options.connect_timeout); // not in the first step
      local_->use_nccl(comm_.get(), 0, nccl_step_timeout(options.rank_timeout));
    }
    std::fprintf(stderr, "[pipeline] %d ranks ready (%s, activations over %s)\n", world,
                 options.backend.c_str(), nccl ? "NCCL" : "TCP");
  }

  const models::ModelConfig& config() const override { return local_->config(); }
  int64_t max_batch() const override { return max_batch_; }
  int64_t max_seq() const override { return max_seq_; }
  /// Every stage pages alike (its own layers' caches, the same block ids): rank 0's stage's
  /// geometry within the smallest rank's pools.
  const models::KvGeometry& kv_geometry() const override { return kv_; }
  std::string backend() const override { return options_.backend; }

  std::vector<std::vector<float>> step(const models::StepInput& in) override {
    check_size(in);
    std::vector<std::vector<float>> logits(in.tokens.size());
    guarded([&] { run_ranks(in, false, &logits, nullptr); });
    return logits;
  }

  /// The last rank picks the greedy tokens and sends back only them.
  std::vector<int32_t> step_greedy(const models::StepInput& in) override {
    if (plan_.plan->stages.size() == 1)
      return Model::step_greedy(in);
    check_size(in);
    std::vector<int32_t> ids(in.tokens.size());
    guarded([&] { run_ranks(in, true, nullptr, &ids); });
    return ids;
  }

  void reset() override {
    guarded([&] {
      local_->reset();
      for (int r = 1; r < coord_->world(); ++r)
        coord_->send(r, message(kReset, nlohmann::json::object()));
    });
  }

  std::string broken() const override {
    std::lock_guard<std::mutex> lock(broken_mu_);
    return broken_;
  }

private:
  /// A step the workers could not take: refused before any rank hears of it.
  void check_size(const models::StepInput& in) const {
    if (static_cast<int64_t>(in.tokens.size()) > max_batch_)
      throw Error(fmt::format("{} sequences in one step exceed the maximum batch of {}",
                              in.tokens.size(), max_batch_));
  }

  /// Runs `f` unless the pipeline is broken; a rank that stopped (or any failure mid-step,
  /// which leaves the ranks out of step with each other) breaks it for good.
  template <class F> void guarded(F&& f) {
    if (std::string why = broken(); !why.empty())
      throw Error("the pipeline is broken: " + why);
    try {
      f();
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(broken_mu_);
      broken_ = e.what();
      throw;
    }
  }

  /// One step through every rank as micro-batches on a pipeline schedule: at tick t rank r
  /// works on micro-batch t - r, which rank r - 1 finished at tick t - 1 (rank 0 relays the
  /// activations). Rank 0 sends the workers their inputs first, then runs stage 0, then
  /// collects; the last rank's results give each sequence's logits row (or, with `greedy`,
  /// its id).
  void run_ranks(const models::StepInput& in, bool greedy, std::vector<std::vector<float>>* logits,
                 std::vector<int32_t>* ids) {
    maybe_fault(options_.fault, 0, steps_); // tests: "0:stop@STEP" freezes rank 0 here
    const int world = coord_->world();
    const auto tokens = static_cast<size_t>(token_count(in));
    bool prompt = false;
    for (const auto& t : in.tokens)
      prompt = prompt || t.size() > 1;
    const std::vector<MicroBatch> mbs =
        micro_batches(in, micro_batch_count(options_.micro_batches, tokens, prompt, world));
    const int m_count = static_cast<int>(mbs.size());
    if (comm_) {
      run_ranks_nccl(mbs, greedy, logits, ids);
      return;
    }
    // out[r][m]: what rank r sent on for micro-batch m, until rank r + 1 has it.
    std::vector<std::vector<Named>> out(size_t(world), std::vector<Named>(mbs.size()));
    for (int t = 0; t < m_count + world - 1; ++t) {
      for (int r = 1; r < world; ++r) {
        const int m = t - r;
        if (m < 0 || m >= m_count)
          continue;
        const nlohmann::json head = step_header(mbs[size_t(m)].in, steps_, greedy);
        coord_->send(r, message(kStep, head, out[size_t(r - 1)][size_t(m)]));
        out[size_t(r - 1)][size_t(m)].clear();
      }
      if (t < m_count)
        out[0][size_t(t)] = local_->run(mbs[size_t(t)].in, {});
      for (int r = 1; r < world; ++r) {
        const int m = t - r;
        if (m < 0 || m >= m_count)
          continue;
        Named& got = out[size_t(r)][size_t(m)];
        const bool last = r == world - 1;
        const std::vector<BoundaryTensor> sends =
            last ? std::vector<BoundaryTensor>()
                 : stage_sends(plan_.plan->stages[size_t(r)], token_count(mbs[size_t(m)].in));
        const nlohmann::json head =
            coord_->await(r, kResult, &got,
                          result_frame_bytes(mbs[size_t(m)].in, sends, last, greedy,
                                             local_->config().vocab_size));
        if (last)
          take_results(r, mbs[size_t(m)], head, got, logits, ids);
        else // relayed to rank r + 1 next tick: first checked against the plan's boundary
          check_boundary(got, sends, fmt::format("pipeline rank {}", r));
      }
    }
    ++steps_;
  }

  /// run_ranks with the activations moving rank to rank over NCCL: every worker gets all the
  /// step's micro-batch headers at once (a rank's receive must be posted while the previous
  /// rank sends), rank 0 runs its micro-batches (each sent on to rank 1 on the device), then
  /// collects every rank's acknowledgements and the last rank's results.
  void run_ranks_nccl(const std::vector<MicroBatch>& mbs, bool greedy,
                      std::vector<std::vector<float>>* logits, std::vector<int32_t>* ids) {
    const int world = coord_->world();
    for (int r = 1; r < world; ++r)
      for (const MicroBatch& mb : mbs) {
        const nlohmann::json head = step_header(mb.in, steps_, greedy);
        coord_->send(r, message(kStep, head));
      }
    try {
      for (const MicroBatch& mb : mbs)
        local_->run(mb.in, {});
    } catch (const Error&) { // usually a rank that stopped: say which, if one of ours did
      coord_->check_children();
      throw;
    }
    for (int r = 1; r < world; ++r)
      for (const MicroBatch& mb : mbs) {
        Named got; // over NCCL an intermediate rank's result is an acknowledgement
        const nlohmann::json head = coord_->await(
            r, kResult, &got,
            result_frame_bytes(mb.in, {}, r == world - 1, greedy, local_->config().vocab_size));
        if (r == world - 1)
          take_results(r, mb, head, got, logits, ids);
      }
    ++steps_;
  }

  /// The last rank's answer for `mb`, checked against what the step asked for before use: one id
  /// per sequence inside the vocabulary, or one float logits tensor of [sequences or tokens,
  /// vocabulary].
  void take_results(int r, const MicroBatch& mb, const nlohmann::json& head, const Named& got,
                    std::vector<std::vector<float>>* logits, std::vector<int32_t>* ids) {
    const int64_t vocab = local_->config().vocab_size;
    auto bad = [&](const std::string& what) {
      return Error(fmt::format("pipeline rank {} sent a malformed result: {}", r, what));
    };
    if (ids) {
      const auto it = head.find("ids");
      if (it == head.end() || !it->is_array() || it->size() != mb.seq.size())
        throw bad(fmt::format("expected {} ids", mb.seq.size()));
      for (const auto& id : *it) // kNonFinite: the last rank's logits row was not finite
        if (!id.is_number_integer() || (id.get<int64_t>() < 0 && id.get<int64_t>() != kNonFinite) ||
            id.get<int64_t>() >= vocab)
          throw bad(fmt::format("id {} is outside the vocabulary of {}", id.dump(), vocab));
      const std::vector<int32_t> picked = it->get<std::vector<int32_t>>();
      for (size_t i = 0; i < mb.seq.size(); ++i)
        if (mb.last[i])
          (*ids)[mb.seq[i]] = picked.at(i);
      return;
    }
    const auto tokens = static_cast<size_t>(token_count(mb.in));
    if (got.size() != 1 || got[0].second.is_int() || got[0].second.shape.size() != 2 ||
        got[0].second.shape[1] != vocab ||
        (got[0].second.shape[0] != static_cast<int64_t>(mb.in.tokens.size()) &&
         got[0].second.shape[0] != static_cast<int64_t>(tokens)))
      throw bad(fmt::format("expected one float logits tensor of [{} or {}, {}]",
                            mb.in.tokens.size(), tokens, vocab));
    std::vector<std::vector<float>> rows =
        sequence_logits(got.at(0).second, mb.in.tokens.size(),
                        models::step_params(mb.in).at(models::params::kLogitRows));
    for (size_t i = 0; i < mb.seq.size(); ++i)
      if (mb.last[i])
        (*logits)[mb.seq[i]] = std::move(rows[i]);
  }

  runtime::OpenedPlan plan_;
  PipelineOptions options_;
  int64_t max_batch_, max_seq_;
  std::unique_ptr<StageRunner> local_;      ///< stage 0, made after the handshake
  models::KvGeometry kv_;                   ///< the pools every rank holds
  std::unique_ptr<runtime::NcclComm> comm_; ///< with the NCCL transport
  /// Declared last, destroyed first: the workers are told to quit (and reaped) before this
  /// rank's communicator and stage go, as they leave theirs.
  std::unique_ptr<Coordinator> coord_;
  int64_t steps_ = 0;
  mutable std::mutex broken_mu_; ///< broken() may be asked from any thread
  std::string broken_;
};

} // namespace

int micro_batch_count(int requested, size_t tokens, bool prompt, int world) {
  if (requested > 0)
    return requested;
  return prompt && tokens >= size_t(2 * world) ? world : 1;
}

std::unique_ptr<Model> make_pipeline_model(const runtime::OpenedPlan& plan,
                                           const PipelineOptions& options, int64_t max_batch,
                                           int64_t max_seq, const CudaModelOptions& cuda,
                                           const runtime::RunSettings& settings) {
  return std::make_unique<PipelineModel>(plan, options, max_batch, max_seq, cuda, settings);
}

} // namespace xserv::engine::pipeline
