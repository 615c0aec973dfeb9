// DeviceStage: allocation, kernel loading and binding, decode-graph capture, the sub-step (step
// inputs up, launches, results down) and the per-op profile; EventTimer.
//
// Decode sub-steps (one token per sequence) are captured as CUDA graphs, one per (batch size,
// attention key bucket), and replayed: launches read every step input from the params buffer and
// write to fixed addresses, so only the params upload before the replay changes between steps.
#include "runtime/device_stage.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>
#include <string_view>
#include <tuple>

#include <fmt/format.h>

#include "base/error.h"
#include "runtime/blas.h"
#include "runtime/device.h"
#include "runtime/executor.h"
#include "runtime/module.h"
#include "runtime/timeline.h"

namespace xserv::runtime {

namespace {

void check(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess)
    throw Error(fmt::format("CUDA error in {}: {}", what, cudaGetErrorString(err)));
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

} // namespace

struct DeviceStage::State {
  /// The program's kernels, loaded (the executor holds pointers to them: filled once).
  std::vector<Module> modules;
  std::vector<Kernel> kernels;
  /// cuBLAS for the table's library gemms (none when it has no library calls); declared before
  /// the executor, which points at it.
  std::unique_ptr<Blas> blas;
  std::unique_ptr<Executor> executor; ///< the launch table bound to this stage's memory
  /// Captured decode graphs by (tokens, sequences, attention key bucket).
  std::map<std::tuple<int, int, int>, cudaGraphExec_t> graph_execs;
  std::vector<cudaEvent_t> events;
  std::vector<size_t> entry_launches; ///< kernels each table entry launched in the last sub-step
  struct OpTime {
    double ms = 0;
    int64_t calls = 0;
  };
  std::map<std::pair<std::string, std::string>, OpTime> op_times;
  std::map<std::string, int64_t> phase_steps;
  /// A timeline plan's stamp arrays (kernel index, device address), one per kernel module.
  std::vector<std::pair<int, void*>> timeline;

  cudaGraphExec_t capture(cudaStream_t stream, const StepShape& s) {
    // Relaxed: a first launch of a kernel may set its shared-memory attribute, which is no
    // stream operation and safe to run while capturing.
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), "starting a graph capture");
    cudaGraph_t g = nullptr;
    try {
      executor->run(s, stream);
    } catch (...) {
      if (cudaStreamEndCapture(stream, &g) == cudaSuccess && g)
        cudaGraphDestroy(g);
      cudaGetLastError();
      throw;
    }
    check(cudaStreamEndCapture(stream, &g), "capturing a decode step");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    check(err, "instantiating a decode graph");
    return exec;
  }
};

DeviceStage::DeviceStage(const StageLayout& layout,
                         const std::map<std::string, size_t>& param_offsets, size_t param_words,
                         const DeviceStageOptions& options)
    : layout_(layout), options_(options), param_offsets_(param_offsets), param_words_(param_words),
      state_(std::make_unique<State>()) {
  options_.cuda_graphs = options.cuda_graphs && !options.profile;
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating a stream");
  params_dev_ = static_cast<int32_t*>(allocate(param_words_ * sizeof(int32_t)));
  check(cudaMallocHost(reinterpret_cast<void**>(&params_host_), param_words_ * sizeof(int32_t)),
        "pinned params");
  const size_t out_rows =
      static_cast<size_t>(layout_.output.per_token ? layout_.tokens : layout_.max_batch);
  check(cudaMallocHost(reinterpret_cast<void**>(&out_host_),
                       out_rows * static_cast<size_t>(layout_.output.vocab) * sizeof(float)),
        "pinned logits");
  arena_ = static_cast<char*>(allocate(static_cast<size_t>(layout_.arena_bytes)));
  for (const StageLayout::Cache& c : layout_.caches)
    (c.window ? window_block_bytes_ : kv_block_bytes_) += c.block_bytes();
}

void DeviceStage::allocate_pools(int64_t kv_blocks, int64_t window_blocks) {
  XSERV_CHECK(caches_.empty(), "DeviceStage::allocate_pools twice");
  XSERV_CHECK(kv_blocks >= 1 && window_blocks >= 0, "a KV pool without blocks");
  kv_blocks_ = kv_blocks;
  window_blocks_ = window_blocks;
  const uint64_t need =
      kv_block_bytes_ * uint64_t(kv_blocks) + window_block_bytes_ * uint64_t(window_blocks);
  const auto [free_b, total_b] = device_memory();
  if (need > free_b)
    throw Error(fmt::format("the KV caches need {:.2f} GiB ({} + {} blocks), the GPU has {:.2f} "
                            "GiB free of {:.2f}: ask for less KV memory or fewer positions",
                            double(need) / (1ull << 30), kv_blocks, window_blocks,
                            double(free_b) / (1ull << 30), double(total_b) / (1ull << 30)));
  for (const StageLayout::Cache& c : layout_.caches) {
    const size_t bytes = size_t(c.block_bytes()) * size_t(c.window ? window_blocks : kv_blocks);
    caches_.emplace_back(allocate(bytes), bytes);
  }
  reset();
}

DeviceStage::~DeviceStage() {
  if (stream_)
    cudaStreamSynchronize(stream_);
  if (!state_->graph_execs.empty())
    log(fmt::format("{} CUDA graphs captured", state_->graph_execs.size()));
  if (options_.profile)
    print_profile();
  if (!state_->timeline.empty())
    print_timeline();
  for (cudaEvent_t e : state_->events)
    cudaEventDestroy(e);
  for (auto& [key, exec] : state_->graph_execs)
    cudaGraphExecDestroy(exec);
  state_->executor.reset();
  for (void* p : allocations_)
    cudaFree(p);
  if (params_host_)
    cudaFreeHost(params_host_);
  if (keys_host_)
    cudaFreeHost(keys_host_);
  if (mask_host_)
    cudaFreeHost(mask_host_);
  if (mask_rows_host_)
    cudaFreeHost(mask_rows_host_);
  if (out_host_)
    cudaFreeHost(out_host_);
  if (stream_)
    cudaStreamDestroy(stream_);
}

void DeviceStage::log(const std::string& line) const {
  if (!options_.quiet)
    std::fprintf(stderr, "[cuda] %s\n", line.c_str());
}

void* DeviceStage::allocate(size_t bytes, const void* host) {
  void* p = nullptr;
  check(cudaMalloc(&p, std::max<size_t>(bytes, 16)),
        fmt::format("allocating {:.1f} MiB", double(bytes) / (1 << 20)));
  allocations_.push_back(p);
  allocated_ += bytes;
  if (host)
    check(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice), "uploading a constant");
  return p;
}

void DeviceStage::load(LaunchTable table, const std::vector<std::vector<char>>& cubins,
                       const std::map<std::string, void*>& weights, const std::string& source,
                       int compiled, double load_ms) {
  State& st = *state_;
  XSERV_CHECK(caches_.size() == layout_.caches.size(), "DeviceStage::load before allocate_pools");
  // Its regions: the arena, weights by name, caches in the layout's order, step inputs by name,
  // and its scratch buffers (constants uploaded once).
  Bindings bind;
  bind.arena = arena_;
  for (const auto& [name, p] : weights)
    bind.weights[name] = p;
  for (const auto& c : caches_)
    bind.caches.push_back(c.first);
  for (const auto& [name, off] : param_offsets_)
    bind.params[name] = params_dev_ + off;
  for (const ScratchBuffer& b : table.scratch)
    bind.scratch.push_back(allocate(b.bytes, b.f64.empty() ? nullptr : b.f64.data()));
  if (table.argmax_scratch >= 0) {
    argmax_keys_ = const_cast<void*>(bind.scratch[size_t(table.argmax_scratch)]);
    argmax_chunks_ = table.argmax_chunks;
  }
  if (argmax_keys_)
    check(cudaMallocHost(reinterpret_cast<void**>(&keys_host_),
                         size_t(layout_.max_batch) * size_t(argmax_chunks_) * sizeof(uint64_t)),
          "pinned greedy keys");
  if (argmax_keys_ && !table.masked_pick.empty()) {
    // Structured output's masked pick: masks staged in pinned memory, a row per sequence.
    const size_t rows = size_t(layout_.max_batch), words = size_t(table.mask_words);
    const ScratchBuffer& m = table.scratch.at(size_t(table.mask_scratch));
    const ScratchBuffer& r = table.scratch.at(size_t(table.mask_rows_scratch));
    // The kernel's mask stride is the vocabulary's, compiled in; its buffers are its own.
    const auto vocab_words = size_t((layout_.output.vocab + 31) / 32);
    const std::set<int> distinct = {table.argmax_scratch, table.mask_scratch,
                                    table.mask_rows_scratch};
    if (words != vocab_words || distinct.size() != 3 || !m.f64.empty() || !r.f64.empty())
      throw Error(fmt::format("{}: the masked pick's mask_words {} (the vocabulary takes {}) or "
                              "scratch buffers {}, {} (keys: {}) do not fit the plan",
                              source, words, vocab_words, table.mask_scratch,
                              table.mask_rows_scratch, table.argmax_scratch));
    if (m.bytes < rows * words * 4 || r.bytes < rows * 4)
      throw Error(fmt::format("{}: the masked pick's scratch ({} and {} bytes) is smaller than "
                              "{} rows of {} mask words",
                              source, m.bytes, r.bytes, rows, words));
    uint32_t* staging = nullptr;
    int32_t* staging_rows = nullptr;
    check(cudaMallocHost(reinterpret_cast<void**>(&staging), rows * words * 4),
          "pinned token masks");
    if (const cudaError_t e = cudaMallocHost(reinterpret_cast<void**>(&staging_rows), rows * 4);
        e != cudaSuccess) {
      cudaFreeHost(staging);
      check(e, "pinned token masks");
    }
    mask_host_ = staging; // both or neither: picks_masked() reads the first
    mask_rows_host_ = staging_rows;
    masks_dev_ = const_cast<void*>(bind.scratch[size_t(table.mask_scratch)]);
    mask_rows_dev_ = const_cast<void*>(bind.scratch[size_t(table.mask_rows_scratch)]);
    mask_words_ = table.mask_words;
  }
  if (options_.profile) {
    st.events.resize(table.launches.size() + 1);
    st.entry_launches.resize(table.launches.size());
    for (cudaEvent_t& e : st.events)
      check(cudaEventCreate(&e), "creating a profiling event");
  }
  auto t0 = std::chrono::steady_clock::now();
  if (cubins.size() != table.kernels.size())
    throw Error(fmt::format("{}: {} cubins for the {} kernels of its launch table", source,
                            cubins.size(), table.kernels.size()));
  st.modules.reserve(cubins.size()); // stable addresses for the executor
  st.kernels.reserve(cubins.size());
  for (size_t i = 0; i < cubins.size(); ++i) {
    const std::string& name = table.kernels[i].name;
    st.modules.push_back(Module::load(cubins[i], name));
    st.kernels.push_back(st.modules.back().kernel(name));
    // A timeline plan's kernel (compile --timeline) carries the stamps' symbol.
    const std::string_view bytes(cubins[i].data(), cubins[i].size());
    if (bytes.find(kTimelineSymbol) != std::string_view::npos)
      if (auto [p, n] = st.modules.back().global(kTimelineSymbol);
          p && n == kTimelineWords * sizeof(uint64_t))
        st.timeline.emplace_back(int(i), p);
  }
  if (!st.timeline.empty())
    log(fmt::format("{}: a timeline plan: {} kernels stamp their launches (diagnostic; the "
                    "report comes when the stage closes)",
                    source, st.timeline.size()));
  const size_t kernel_count = table.kernels.size(), library_calls = table.library.size();
  if (library_calls > 0)
    st.blas = std::make_unique<Blas>();
  st.executor =
      std::make_unique<Executor>(std::move(table), bind, loaded_kernels(st.modules, st.kernels));
  st.executor->set_blas(st.blas.get());
  // The fixed order's algorithms (plans in the natural K order), picked, checked and tuned by
  // step size now, not in a step that a CUDA graph may be capturing (the call's own activation
  // buffers are the tuning's scratch before any step); a line each shape and faster bucket.
  std::set<std::tuple<int, int, int>> fixed;
  const std::vector<PlanLibraryCall>& library = st.executor->table().library;
  for (size_t i = 0; i < library.size(); ++i) {
    const PlanLibraryCall& c = library[i];
    if (c.fixed_rows <= 0 || !fixed.insert({c.n, c.k, c.fixed_rows}).second)
      continue;
    log(fmt::format("{}: fixed-order gemm {} x {} -> {}: {}", source, c.fixed_rows, c.k, c.n,
                    st.blas->fixed_algorithm(c.n, c.k, c.fixed_rows)));
    const auto [x, w, y] = st.executor->library_operands(int(i));
    if (x && w && y)
      for (const std::string& line : st.blas->tune_fixed(c.n, c.k, c.fixed_rows, x, w, y))
        log(fmt::format("{}: fixed-order gemm {}", source, line));
  }
  if (library_calls > 0)
    log(fmt::format("{}: {} library gemms of the launch table go to cuBLAS", source,
                    library_calls));
  log(fmt::format("{}: launch table and {} kernels ({} cubins, {} compiled by NVRTC) ... {:.1f} s",
                  source, kernel_count, int(kernel_count) - compiled, compiled,
                  load_ms / 1e3 + seconds_since(t0)));
  const DeviceInfo dev = probe_device();
  st.executor->set_dependent_launch(options_.dependent_launch && dev.sm_major >= 9);
  if (!options_.repeat_kernel.empty()) {
    st.executor->set_repeat(options_.repeat_kernel, options_.repeat_times);
    log(fmt::format("XSERV_PROFILE_REPEAT: kernels named *{}* launch {} times (timing only: the "
                    "results are not the model's)",
                    options_.repeat_kernel, options_.repeat_times));
  }
  if (options_.cuda_graphs && options_.capture_at_start)
    capture_all();
}

void DeviceStage::capture_all() {
  // Every decode shape a run can meet, captured now rather than inside a request (as vLLM
  // does): the padded batch sizes (decode_batch_bucket) up to max_batch x attention key
  // buckets up to max_seq's.
  auto t0 = std::chrono::steady_clock::now();
  const int top = attention_key_bucket(static_cast<int>(layout_.max_seq));
  const int most = static_cast<int>(std::min<int64_t>(layout_.max_batch, layout_.tokens));
  const std::vector<int> sizes = decode_batch_sizes(most);
  int buckets = 0;
  for (int b : sizes)
    for (int bucket = 64, n = 0; bucket <= top; bucket *= 2, ++n) {
      buckets = std::max(buckets, n + 1);
      StepShape s{b, b, bucket - 1};
      state_->graph_execs.emplace(std::make_tuple(b, b, bucket), state_->capture(stream_, s));
    }
  log(fmt::format("captured {} decode graphs ({} batch sizes 1..{} x {} key buckets) in {:.2f} s",
                  state_->graph_execs.size(), sizes.size(), most, buckets, seconds_since(t0)));
}

size_t DeviceStage::entries() const {
  return state_->executor ? state_->executor->size() : 0;
}

size_t DeviceStage::graphs_captured() const {
  return state_->graph_execs.size();
}

void DeviceStage::run(const SubStep& s) {
  State& st = *state_;
  XSERV_CHECK(st.executor, "DeviceStage::run before load");
  if (s.params.empty())
    check(cudaMemcpyAsync(params_dev_, params_host_, param_words_ * sizeof(int32_t),
                          cudaMemcpyHostToDevice, stream_),
          "uploading the step inputs");
  for (const auto& [first, count] : s.params) {
    XSERV_CHECK(first + count <= param_words_, "a step-input range past the block");
    check(cudaMemcpyAsync(params_dev_ + first, params_host_ + first, count * sizeof(int32_t),
                          cudaMemcpyHostToDevice, stream_),
          "uploading the step inputs");
  }
  // A pipeline stage's received activations: this sub-step's rows of each recv value.
  for (const HostUpload& u : s.uploads)
    check(cudaMemcpyAsync(arena_ + u.arena_offset, u.src, u.bytes, cudaMemcpyHostToDevice, stream_),
          "uploading a received activation");
  const int tokens = s.shape.tokens, seqs = s.shape.seqs;
  if (s.transport) // received on the device, into each recv value's buffer
    for (const StageLayout::Recv& r : layout_.recvs)
      s.transport->receive(r.name, arena_ + r.offset, size_t(tokens) * r.row_bytes, stream_);
  const bool graph = options_.cuda_graphs && tokens == seqs;
  if (graph) {
    // A decode sub-step: replay (capturing first) the graph of its sizes.
    const auto key = std::make_tuple(tokens, seqs, attention_key_bucket(s.shape.max_pos + 1));
    auto it = st.graph_execs.find(key);
    if (it == st.graph_execs.end())
      it = st.graph_execs.emplace(key, st.capture(stream_, s.shape)).first;
    check(cudaGraphLaunch(it->second, stream_), "replaying a decode graph");
  } else if (options_.profile) {
    check(cudaEventRecord(st.events[0], stream_), "profiling");
    for (size_t i = 0; i < st.executor->size(); ++i) {
      st.entry_launches[i] = st.executor->run(s.shape, stream_, i, i + 1);
      check(cudaEventRecord(st.events[i + 1], stream_), "profiling");
    }
  } else {
    st.executor->run(s.shape, stream_);
  }
  const char* output = arena_ + layout_.output.offset;
  const size_t v = static_cast<size_t>(layout_.output.vocab);
  if (s.transport && layout_.output.sends) { // on to the next stage
    s.transport->send(output, size_t(tokens) * layout_.output.row_bytes, stream_);
    s.transport->wait(stream_);
    return;
  }
  if (s.keys && s.masks && mask_host_) {
    // Structured output: the masks came from the host while the step ran; the masked pick
    // rewrites the keys of their rows. The hook may throw (a mask thread's error): the step's
    // queued work is waited for first, so that nothing still reads the pinned step inputs
    // when the caller retries.
    size_t masked = 0;
    try {
      masked = s.masks(mask_host_, mask_rows_host_);
    } catch (...) {
      cudaStreamSynchronize(stream_);
      throw;
    }
    XSERV_CHECK(masked <= s.rows, "more masked rows than the sub-step has");
    for (size_t i = 0; i < masked; ++i)
      XSERV_CHECK(mask_rows_host_[i] >= 0 && size_t(mask_rows_host_[i]) < s.rows,
                  "a masked row outside the sub-step's rows");
    if (masked > 0) {
      check(cudaMemcpyAsync(mask_rows_dev_, mask_rows_host_, masked * sizeof(int32_t),
                            cudaMemcpyHostToDevice, stream_),
            "uploading the token masks");
      check(cudaMemcpyAsync(masks_dev_, mask_host_, masked * size_t(mask_words_) * 4,
                            cudaMemcpyHostToDevice, stream_),
            "uploading the token masks");
      st.executor->run_masked(static_cast<int>(masked), stream_);
    }
  }
  if (s.keys) { // the sampling epilogue's keys (only asked for when it exists) ...
    check(cudaMemcpyAsync(keys_host_, argmax_keys_, s.rows * argmax_chunks_ * sizeof(uint64_t),
                          cudaMemcpyDeviceToHost, stream_),
          "copying the greedy tokens back");
    // ... and the logits rows a sampling request needs, each where a full copy would put it.
    for (size_t r : s.wanted)
      check(cudaMemcpyAsync(out_host_ + r * v, reinterpret_cast<const float*>(output) + r * v,
                            v * sizeof(float), cudaMemcpyDeviceToHost, stream_),
            "copying a logits row back");
  } else {
    check(cudaMemcpyAsync(out_host_, output, s.rows * v * sizeof(float), cudaMemcpyDeviceToHost,
                          stream_),
          "copying the logits back");
  }
  if (s.transport)
    s.transport->wait(stream_);
  else
    check(cudaStreamSynchronize(stream_), "running a step");
  if (options_.profile && !graph) {
    const std::string phase =
        tokens == seqs ? fmt::format("decode B={}", seqs) : fmt::format("prefill T={}", tokens);
    ++st.phase_steps[phase];
    for (size_t i = 0; i < st.executor->size(); ++i) {
      if (st.entry_launches[i] == 0) // an entry for other step sizes
        continue;
      float ms = 0;
      check(cudaEventElapsedTime(&ms, st.events[i], st.events[i + 1]), "profiling");
      State::OpTime& t = st.op_times[{phase, st.executor->table().launches[i].label}];
      t.ms += ms;
      ++t.calls;
    }
  }
}

void DeviceStage::reset() {
  for (auto& c : caches_)
    check(cudaMemsetAsync(c.first, 0, c.second, stream_), "clearing the KV cache");
  check(cudaStreamSynchronize(stream_), "clearing the KV cache");
}

void DeviceStage::copy_block(bool window, int32_t src, int32_t dst) {
  const int64_t blocks = window ? window_blocks_ : kv_blocks_;
  XSERV_CHECK(src >= 0 && src < blocks && dst >= 0 && dst < blocks,
              fmt::format("a copy of KV block {} to {} in a pool of {}", src, dst, blocks));
  for (size_t i = 0; i < caches_.size(); ++i) {
    const StageLayout::Cache& c = layout_.caches[i];
    if (c.window != window)
      continue;
    char* base = static_cast<char*>(caches_[i].first);
    const size_t b = size_t(c.block_bytes());
    check(cudaMemcpyAsync(base + size_t(dst) * b, base + size_t(src) * b, b,
                          cudaMemcpyDeviceToDevice, stream_),
          "copying a KV block");
  }
}

void DeviceStage::synchronize() {
  check(cudaStreamSynchronize(stream_), "synchronize");
}

std::vector<float> DeviceStage::read_arena(uint64_t offset, size_t count) const {
  if (offset > layout_.arena_bytes || count > (layout_.arena_bytes - offset) / sizeof(float))
    throw Error(fmt::format("read_arena: {} floats at byte {} lie outside the {}-byte arena", count,
                            offset, layout_.arena_bytes));
  std::vector<float> out(count);
  check(cudaStreamSynchronize(stream_), "finishing the queued work");
  check(cudaMemcpy(out.data(), arena_ + offset, count * sizeof(float), cudaMemcpyDeviceToHost),
        "copying an activation back");
  return out;
}

void DeviceStage::print_timeline() const {
  std::vector<TimelineStamp> stamps;
  std::vector<uint64_t> slots(kTimelineWords);
  for (const auto& [k, p] : state_->timeline) {
    if (cudaMemcpy(slots.data(), p, slots.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost) !=
        cudaSuccess) {
      cudaGetLastError();
      std::fprintf(stderr, "[timeline] could not read the stamps of %s\n",
                   state_->kernels[size_t(k)].name.c_str());
      return;
    }
    for (size_t i = 0; i < kTimelineSlots; ++i)
      stamps.push_back({k, slots[2 + 2 * i], slots[3 + 2 * i]});
  }
  std::vector<std::string> names;
  for (const Kernel& k : state_->kernels)
    names.push_back(k.name);
  // A step ends with the table's last launch (the sampling epilogue), or its masked pick.
  std::vector<int> ends;
  const LaunchTable& table = state_->executor->table();
  for (auto it = table.launches.rbegin(); it != table.launches.rend() && ends.empty(); ++it)
    if (it->kernel >= 0)
      ends.push_back(it->kernel);
  for (const PlanLaunch& l : table.masked_pick)
    if (l.kernel >= 0)
      ends.push_back(l.kernel);
  for (const std::string& line :
       timeline_lines(timeline_report(std::move(stamps), names, 200.0, ends)))
    std::fprintf(stderr, "%s\n", line.c_str());
}

void DeviceStage::print_profile() const {
  // Per phase: each op's share of the summed launch times, largest first.
  std::map<std::string, std::vector<std::pair<std::string, State::OpTime>>> by_phase;
  for (const auto& [key, t] : state_->op_times)
    by_phase[key.first].push_back({key.second, t});
  for (auto& [phase, ops] : by_phase) {
    double total = 0;
    for (const auto& [op, t] : ops)
      total += t.ms;
    std::sort(ops.begin(), ops.end(),
              [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    const double steps = double(state_->phase_steps.at(phase));
    std::fprintf(stderr, "[profile] %s: %lld steps, %.3f ms per step (launch to launch)\n",
                 phase.c_str(), static_cast<long long>(state_->phase_steps.at(phase)),
                 total / steps);
    for (const auto& [op, t] : ops)
      std::fprintf(stderr, "[profile]   %-24s %9.3f ms/step %5.1f%%  %6.1f us/entry\n", op.c_str(),
                   t.ms / steps, 100.0 * t.ms / total, 1e3 * t.ms / double(t.calls));
  }
}

EventTimer::EventTimer(Stream stream) : stream_(stream) {
  cudaEvent_t b = nullptr, e = nullptr;
  check(cudaEventCreate(&b), "creating a timing event");
  begin_ = b;
  check(cudaEventCreate(&e), "creating a timing event");
  end_ = e;
}

EventTimer::~EventTimer() {
  cudaEventDestroy(static_cast<cudaEvent_t>(begin_));
  cudaEventDestroy(static_cast<cudaEvent_t>(end_));
}

void EventTimer::start() {
  check(cudaEventRecord(static_cast<cudaEvent_t>(begin_), stream_), "recording a timing event");
}

double EventTimer::stop() {
  check(cudaEventRecord(static_cast<cudaEvent_t>(end_), stream_), "recording a timing event");
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(end_)), "waiting for a timing event");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(begin_), static_cast<cudaEvent_t>(end_)),
        "reading a timing event");
  return ms;
}

} // namespace xserv::runtime
