// CudaModel: construction (weights, caches and arena for the program's layout, its kernels, the
// decode graphs) and the step loop.
//
// A step runs in sub-steps of at most the layout's step capacity (the plan's --prefill-chunk,
// 2048 by default) and synchronises once per sub-step. Decode sub-steps (one token per sequence)
// are captured as CUDA graphs, one per (batch size, attention key bucket), and replayed: launches
// read every step input from the params buffer and write to fixed addresses, so only the params
// upload before the replay changes between steps. The launches are data: the program's launch
// table, replayed by runtime::Executor. Profiling times every table entry instead (graphs off).
#include "cli/cuda_model.h"
#include "cli/cuda_model_impl.h"

namespace xserv::cli {
namespace fs = std::filesystem;
using cuda_impl::check;
using cuda_impl::seconds_since;

CudaModel::CudaModel(const fs::path& model_dir, runtime::StageProgram program,
                     const CudaModelOptions& options) {
  const runtime::DeviceInfo dev = runtime::probe_device();
  if (!dev.available)
    throw Error("no GPU: " + dev.reason);
  if (options.cache_dir.empty())
    throw Error("CudaModel: no kernel cache directory (CudaModelOptions::cache_dir)");
  auto t0 = std::chrono::steady_clock::now();
  impl_ = std::make_unique<Impl>(model_dir);
  Impl& m = *impl_;
  m.quiet = options.quiet;
  m.cuda_graphs = options.cuda_graphs && !options.profile;
  m.profile = options.profile;
  m.stage = std::move(program.layout);
  m.max_batch = m.stage.max_batch;
  m.max_seq = m.stage.max_seq;
  if (m.max_batch < 1 || m.max_seq < 1 || m.stage.tokens < 8 || m.stage.tokens > (1 << 24))
    throw Error(fmt::format("{}: a stage layout for max batch {}, max sequence {} and {} tokens "
                            "per step cannot run",
                            program.source, m.max_batch, m.max_seq, m.stage.tokens));
  m.tcap = static_cast<int>(m.stage.tokens);
  const bool dependent = options.dependent_launch && dev.sm_major >= 9;
  m.log(fmt::format("{} ({}, {} SMs, {:.0f} GiB)", dev.name, dev.arch(), dev.multiprocessors,
                    double(dev.memory_bytes) / (1ull << 30)));
  m.per_token = m.stage.output.per_token;
  m.sends = m.stage.output.sends;
  m.vocab = m.stage.output.vocab;

  check(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking), "creating a stream");
  m.allocate_stage();
  reset();

  const fs::path& cache_dir = options.cache_dir;
  auto t1 = std::chrono::steady_clock::now();
  m.log("loading weights ...");
  const size_t before = m.allocated;
  m.upload_weights(cache_dir);
  const size_t weight_bytes = m.allocated - before;
  m.log(fmt::format("loaded {} weight tensors, {:.2f} GB on the GPU, {:.1f} s", m.weights.size(),
                    double(weight_bytes) / 1e9, seconds_since(t1)));

  runtime::LaunchTable& table = program.table;
  // Its regions: the arena, weights by name, caches in graph order, step inputs by name, and its
  // scratch buffers (constants uploaded once).
  runtime::Bindings bind;
  bind.arena = m.arena;
  for (const auto& [name, p] : m.weights)
    bind.weights[name] = p;
  for (const auto& c : m.caches) // the layout's caches in order
    bind.caches.push_back(c.first);
  for (const auto& [name, off] : m.layout.offset)
    bind.params[name] = m.params_dev + off;
  for (const runtime::ScratchBuffer& b : table.scratch)
    bind.scratch.push_back(m.allocate(b.bytes, b.f64.empty() ? nullptr : b.f64.data()));
  if (table.argmax_scratch >= 0) {
    m.argmax_keys = const_cast<void*>(bind.scratch[size_t(table.argmax_scratch)]);
    m.argmax_chunks = table.argmax_chunks;
  }
  if (m.argmax_keys)
    check(cudaMallocHost(reinterpret_cast<void**>(&m.keys_host),
                         size_t(m.max_batch) * size_t(m.argmax_chunks) * sizeof(uint64_t)),
          "pinned greedy keys");
  if (m.profile) {
    m.events.resize(table.launches.size() + 1);
    m.entry_launches.resize(table.launches.size());
    for (cudaEvent_t& e : m.events)
      check(cudaEventCreate(&e), "creating a profiling event");
  }
  auto t2 = std::chrono::steady_clock::now();
  m.load_kernels(table, program.cubins);
  const size_t kernel_count = table.kernels.size();
  m.executor = std::make_unique<runtime::Executor>(std::move(table), bind,
                                                   runtime::loaded_kernels(m.modules, m.kernels));
  m.log(
      fmt::format("{}: launch table and {} kernels ({} cubins, {} compiled by NVRTC) ... {:.1f} s",
                  program.source, kernel_count, int(kernel_count) - program.compiled,
                  program.compiled, program.load_ms / 1e3 + seconds_since(t2)));
  m.executor->set_dependent_launch(dependent);
  if (m.cuda_graphs && options.capture_at_start) {
    // Every decode shape a run can meet, captured now rather than inside a request (as vLLM
    // does): batch sizes 1..max_batch x attention key buckets up to max_seq's.
    auto t3 = std::chrono::steady_clock::now();
    const int top = runtime::attention_key_bucket(static_cast<int>(m.max_seq));
    int buckets = 0;
    for (int b = 1; b <= static_cast<int>(m.max_batch) && b <= m.tcap; ++b)
      for (int bucket = 64, n = 0; bucket <= top; bucket *= 2, ++n) {
        buckets = std::max(buckets, n + 1);
        runtime::StepShape s{b, b, bucket - 1};
        m.graph_execs.emplace(std::make_tuple(b, b, bucket), m.capture(s));
      }
    m.log(fmt::format("captured {} decode graphs (batch 1..{} x {} key buckets) in {:.2f} s",
                      m.graph_execs.size(), std::min<int64_t>(m.max_batch, m.tcap), buckets,
                      seconds_since(t3)));
  }
  m.log(fmt::format("ready: {} launch table entries{}, arena {:.1f} MiB, KV caches for {} x {}, "
                    "{:.2f} GB in all, {:.1f} s",
                    m.executor->size(), m.cuda_graphs ? " (decode as CUDA graphs)" : "",
                    double(m.stage.arena_bytes) / (1 << 20), m.max_batch, m.max_seq,
                    double(m.allocated) / 1e9, seconds_since(t0)));
}

CudaModel::~CudaModel() = default;

const models::ModelConfig& CudaModel::config() const {
  return impl_->ckpt.config();
}
int64_t CudaModel::max_batch() const {
  return impl_->max_batch;
}
int64_t CudaModel::max_seq() const {
  return impl_->max_seq;
}
std::vector<float> CudaModel::read_activation(uint64_t offset, size_t count) const {
  const Impl& m = *impl_;
  if (offset > m.stage.arena_bytes || count > (m.stage.arena_bytes - offset) / sizeof(float))
    throw Error(fmt::format("read_activation: {} floats at byte {} lie outside the {}-byte arena",
                            count, offset, m.stage.arena_bytes));
  std::vector<float> out(count);
  check(cudaStreamSynchronize(m.stream), "finishing the queued work");
  check(cudaMemcpy(out.data(), m.arena + offset, count * sizeof(float), cudaMemcpyDeviceToHost),
        "copying an activation back");
  return out;
}

void CudaModel::reset() {
  for (auto& c : impl_->caches)
    check(cudaMemsetAsync(c.first, 0, c.second, impl_->stream), "clearing the KV cache");
  check(cudaStreamSynchronize(impl_->stream), "clearing the KV cache");
}

void CudaModel::synchronize() {
  check(cudaStreamSynchronize(impl_->stream), "synchronize");
}

size_t CudaModel::graphs_captured() const {
  return impl_->graph_execs.size();
}

bool CudaModel::picks_greedy() const {
  return impl_->argmax_keys != nullptr;
}

namespace {

/// Two CUDA events on the engine's stream: the time the GPU's queue took between them.
class EventStopwatch : public Stopwatch {
public:
  explicit EventStopwatch(cudaStream_t stream) : stream_(stream) {
    check(cudaEventCreate(&begin_), "creating a timing event");
    check(cudaEventCreate(&end_), "creating a timing event");
  }
  ~EventStopwatch() override {
    cudaEventDestroy(begin_);
    cudaEventDestroy(end_);
  }
  void start() override { check(cudaEventRecord(begin_, stream_), "recording a timing event"); }
  double stop() override {
    check(cudaEventRecord(end_, stream_), "recording a timing event");
    check(cudaEventSynchronize(end_), "waiting for a timing event");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, begin_, end_), "reading a timing event");
    return ms;
  }

private:
  cudaStream_t stream_;
  cudaEvent_t begin_ = nullptr, end_ = nullptr;
};

} // namespace

std::unique_ptr<Stopwatch> CudaModel::stopwatch() {
  return std::make_unique<EventStopwatch>(impl_->stream);
}

double CudaModel::peak_memory_gib() const {
  return double(impl_->allocated) / double(1ull << 30);
}

void CudaModel::Impl::run_substep(const models::StepInput& sub,
                                  std::vector<std::vector<float>>& rows, bool all,
                                  std::vector<int32_t>* greedy, const StageInputs& inputs,
                                  const std::vector<size_t>& input_rows,
                                  const StageTransport* transport,
                                  const std::vector<bool>* want_rows) {
  const std::map<std::string, ir::Tensor> p = models::step_params(sub);
  const int tokens = static_cast<int>(p.at(models::params::kTokenIds).numel());
  const int seqs = static_cast<int>(sub.tokens.size());
  for (const auto& [name, off] : layout.offset) {
    const std::vector<int32_t>& src = p.at(name).i;
    std::copy(src.begin(), src.end(), params_host + off);
  }
  check(cudaMemcpyAsync(params_dev, params_host, layout.total * sizeof(int32_t),
                        cudaMemcpyHostToDevice, stream),
        "uploading the step inputs");
  // A pipeline stage's received activations: this sub-step's rows of each recv value.
  for (const auto& [name, full] : inputs) {
    char* dst = arena + recv(name).offset;
    for (size_t i = 0; i < input_rows.size(); ++i) {
      const std::vector<float>& row = full.at(input_rows[i]);
      check(cudaMemcpyAsync(dst + i * row.size() * sizeof(float), row.data(),
                            row.size() * sizeof(float), cudaMemcpyHostToDevice, stream),
            "uploading a received activation");
    }
  }
  if (transport) // received on the device, into each recv value's buffer
    for (const runtime::StageLayout::Recv& r : stage.recvs)
      transport->receive(r.name, arena + r.offset, size_t(tokens) * r.row_bytes, stream);
  runtime::StepShape s;
  s.tokens = tokens;
  s.seqs = seqs;
  for (int32_t pos : p.at(models::params::kPositions).i)
    s.max_pos = std::max(s.max_pos, pos);
  if (cuda_graphs && tokens == seqs) {
    // A decode sub-step: replay (capturing first) the graph of its sizes.
    const auto key = std::make_tuple(tokens, seqs, runtime::attention_key_bucket(s.max_pos + 1));
    auto it = graph_execs.find(key);
    if (it == graph_execs.end())
      it = graph_execs.emplace(key, capture(s)).first;
    check(cudaGraphLaunch(it->second, stream), "replaying a decode graph");
  } else if (profile) {
    check(cudaEventRecord(events[0], stream), "profiling");
    for (size_t i = 0; i < executor->size(); ++i) {
      entry_launches[i] = executor->run(s, stream, i, i + 1);
      check(cudaEventRecord(events[i + 1], stream), "profiling");
    }
  } else {
    executor->run(s, stream);
  }
  const size_t n = static_cast<size_t>(per_token ? tokens : seqs);
  const size_t v = static_cast<size_t>(vocab);
  if (transport && sends) { // on to the next stage
    transport->send(output_ptr(), size_t(tokens) * stage.output.row_bytes, stream);
    transport->wait(stream);
    return;
  }
  const std::vector<int32_t>& last = p.at(models::params::kLogitRows).i;
  if (greedy) { // the sampling epilogue's keys (greedy is only set when it exists) ...
    check(cudaMemcpyAsync(keys_host, argmax_keys, n * argmax_chunks * sizeof(uint64_t),
                          cudaMemcpyDeviceToHost, stream),
          "copying the greedy tokens back");
    // ... and the logits rows a sampling request needs, each where step() would put it.
    if (want_rows)
      for (size_t b = 0; b < static_cast<size_t>(seqs); ++b)
        if ((*want_rows)[b]) {
          const size_t r = per_token ? static_cast<size_t>(last[b]) : b;
          check(cudaMemcpyAsync(out_host + r * v,
                                reinterpret_cast<const float*>(output_ptr()) + r * v,
                                v * sizeof(float), cudaMemcpyDeviceToHost, stream),
                "copying a logits row back");
        }
  } else
    check(cudaMemcpyAsync(out_host, output_ptr(), n * v * sizeof(float), cudaMemcpyDeviceToHost,
                          stream),
          "copying the logits back");
  if (transport)
    transport->wait(stream);
  else
    check(cudaStreamSynchronize(stream), "running a step");
  if (profile && !(cuda_graphs && tokens == seqs)) {
    const std::string phase =
        tokens == seqs ? fmt::format("decode B={}", seqs) : fmt::format("prefill T={}", tokens);
    ++phase_steps[phase];
    for (size_t i = 0; i < executor->size(); ++i) {
      if (entry_launches[i] == 0) // an entry for other step sizes
        continue;
      float ms = 0;
      check(cudaEventElapsedTime(&ms, events[i], events[i + 1]), "profiling");
      OpTime& t = op_times[{phase, executor->table().launches[i].label}];
      t.ms += ms;
      ++t.calls;
    }
  }
  if (greedy) {
    for (size_t b = 0; b < n; ++b)
      greedy->push_back(runtime::argmax_of_keys(keys_host + b * argmax_chunks, argmax_chunks));
    static_assert(runtime::kArgmaxNonFinite == engine::kNonFinite,
                  "a non-finite row's greedy pick is the engine's marker");
    if (want_rows)
      for (size_t b = 0; b < static_cast<size_t>(seqs); ++b) {
        const size_t r = per_token ? static_cast<size_t>(last[b]) : b;
        rows.emplace_back();
        if ((*want_rows)[b])
          rows.back().assign(out_host + r * v, out_host + (r + 1) * v);
      }
    return;
  }
  if (all) {
    for (size_t r = 0; r < n; ++r)
      rows.emplace_back(out_host + r * v, out_host + (r + 1) * v);
    return;
  }
  // One row per sequence whose last token is in this sub-step (the caller marks which).
  for (size_t b = 0; b < static_cast<size_t>(seqs); ++b) {
    const size_t r = per_token ? static_cast<size_t>(last[b]) : b;
    rows.emplace_back(out_host + r * v, out_host + (r + 1) * v);
  }
}

std::vector<std::vector<float>> CudaModel::Impl::run(const models::StepInput& in, bool all,
                                                     const StageInputs& inputs,
                                                     std::vector<int32_t>* greedy,
                                                     const StageTransport* transport,
                                                     const std::vector<bool>* want) {
  Impl& m = *this;
  validate_step(in, m.max_batch, m.max_seq, m.ckpt.config().vocab_size);
  std::vector<std::vector<float>> result(all ? 0 : in.tokens.size());
  std::vector<size_t> seq_offset(in.tokens.size() + 1, 0); // each sequence's first row
  if (!inputs.empty())
    for (size_t b = 0; b < in.tokens.size(); ++b)
      seq_offset[b + 1] = seq_offset[b] + in.tokens[b].size();
  for (const std::vector<Piece>& pieces : split_step(in, static_cast<size_t>(m.tcap))) {
    const models::StepInput sub = piece_step(in, pieces);
    std::vector<size_t> input_rows; // a stage's received rows this sub-step holds, in order
    if (!inputs.empty())
      for (const Piece& pc : pieces)
        for (size_t i = 0; i < pc.len; ++i)
          input_rows.push_back(seq_offset[pc.seq] + pc.start + i);
    std::vector<std::vector<float>> rows;
    std::vector<int32_t> ids;
    std::vector<bool> want_rows; // the pieces whose sequence's logits row is wanted
    if (want)
      for (const Piece& pc : pieces)
        want_rows.push_back((*want)[pc.seq] && ends_sequence(in, pc));
    m.run_substep(sub, rows, all, greedy ? &ids : nullptr, inputs, input_rows, transport,
                  want ? &want_rows : nullptr);
    if (transport && m.sends)
      continue; // sent on the device: nothing comes back
    if (greedy) {
      greedy->resize(in.tokens.size());
      for (size_t i = 0; i < pieces.size(); ++i)
        if (ends_sequence(in, pieces[i])) {
          (*greedy)[pieces[i].seq] = ids[i];
          if (want)
            result[pieces[i].seq] = std::move(rows[i]);
        }
      continue;
    }
    if (all) {
      for (auto& r : rows)
        result.push_back(std::move(r));
      continue;
    }
    for (size_t i = 0; i < pieces.size(); ++i)
      if (ends_sequence(in, pieces[i]))
        result[pieces[i].seq] = std::move(rows[i]);
  }
  return result;
}

std::vector<std::vector<float>> CudaModel::step(const models::StepInput& in) {
  return impl_->run(in, false);
}

engine::StepOutput CudaModel::step_mixed(const models::StepInput& in,
                                         const std::vector<bool>& need_logits) {
  if (!impl_->argmax_keys)
    return Model::step_mixed(in, need_logits);
  XSERV_CHECK(need_logits.size() == in.tokens.size(), "step_mixed: one flag per sequence");
  // Greedy picks on the GPU for every sequence; only the wanted logits rows come back.
  engine::StepOutput out;
  out.logits = impl_->run(in, false, {}, &out.greedy, nullptr, &need_logits);
  return out;
}

std::vector<int32_t> CudaModel::step_greedy(const models::StepInput& in) {
  if (!impl_->argmax_keys)
    return Model::step_greedy(in);
  std::vector<int32_t> ids;
  impl_->run(in, false, {}, &ids);
  return ids;
}

std::vector<std::vector<float>> CudaModel::step_stage(const models::StepInput& in,
                                                      const StageInputs& inputs) {
  return impl_->run(in, impl_->per_token, inputs);
}

std::vector<int32_t> CudaModel::step_stage_greedy(const models::StepInput& in,
                                                  const StageInputs& inputs) {
  if (!impl_->argmax_keys)
    throw Error("step_stage_greedy needs the last stage's per-sequence logits");
  std::vector<int32_t> ids;
  impl_->run(in, false, inputs, &ids);
  return ids;
}

std::vector<std::vector<float>> CudaModel::step_stage_device(const models::StepInput& in,
                                                             const StageTransport& transport,
                                                             std::vector<int32_t>* greedy) {
  if (greedy && !picks_greedy())
    throw Error("step_stage_device: greedy tokens need the last stage's per-sequence logits");
  return impl_->run(in, false, {}, greedy, &transport);
}

std::vector<std::vector<float>> CudaModel::step_all(const models::StepInput& in) {
  if (!impl_->per_token)
    throw Error("step_all needs a graph that returns every token's logits");
  return impl_->run(in, true);
}

} // namespace xserv::cli
