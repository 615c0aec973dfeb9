// CudaModel: the checkpoint's weights uploaded for the program's layout, a runtime::DeviceStage
// over them, and the step loop (sub-steps, step inputs, greedy picks and logits rows).
//
// A step runs in sub-steps of at most the layout's step capacity (the plan's --prefill-chunk,
// 2048 by default) and synchronises once per sub-step (runtime/device_stage.h replays decode
// sub-steps as CUDA graphs).
#include "engine/cuda_model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/error.h"
#include "engine/kv/kv_cache.h"
#include "engine/step_split.h"
#include "engine/weight_specs.h"
#include "models/checkpoint.h"
#include "models/gpt_oss.h"
#include "models/step.h"
#include "runtime/device.h"
#include "runtime/weights.h"

namespace xserv::engine {
namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

} // namespace

struct CudaModel::Impl {
  models::Checkpoint ckpt;
  runtime::StageLayout stage; ///< what the model binds and allocates: the program's layout
  int64_t max_batch = 1, max_seq = 1;
  int tcap = 8; ///< tokens per sub-step
  bool quiet = false;
  bool per_token = false;
  bool sends = false; ///< the stage ends in a pipeline send (a stage that is not the last)
  int64_t vocab = 0;
  ParamLayout layout{8, 1, 1, false};
  models::KvGeometry kv;
  runtime::DeviceWeights device_weights;
  std::map<std::string, void*> weights;
  std::unique_ptr<runtime::DeviceStage> dev; ///< after device_weights: released first

  explicit Impl(const fs::path& dir) : ckpt(models::Checkpoint::open(dir, {.map_data = true})) {}

  void log(const std::string& line) const {
    if (!quiet)
      std::fprintf(stderr, "[cuda] %s\n", line.c_str());
  }

  void upload_weights(const fs::path& cache_dir);
  /// Decides the pools' blocks as CudaModelOptions says and allocates them.
  void size_pools(const CudaModelOptions& o);
  /// The recv named `name` (a pipeline stage's input).
  const runtime::StageLayout::Recv& recv(const std::string& name) const {
    const auto it = std::find_if(stage.recvs.begin(), stage.recvs.end(),
                                 [&](const auto& r) { return r.name == name; });
    if (it == stage.recvs.end())
      throw Error(fmt::format("this stage receives nothing called '{}'", name));
    return *it;
  }
  /// With `greedy`, also the logits rows of the sub-step's sequences b with want_rows[b] come
  /// back in `rows` (an empty row for the others).
  void run_substep(const models::StepInput& sub, std::vector<std::vector<float>>& rows, bool all,
                   std::vector<int32_t>* greedy, const StageInputs& inputs = {},
                   const std::vector<size_t>& input_rows = {},
                   const StageTransport* transport = nullptr,
                   const std::vector<bool>* want_rows = nullptr,
                   const std::function<size_t(uint32_t*, int32_t*)>* masks = nullptr);
  /// One step, sub-step by sub-step. With `greedy`, the sequences' greedy tokens go there
  /// (needs the sampling epilogue) and no logits come back; with `want` too, the sequences b
  /// with want[b] also get their logits rows back; with `masked` too, the sequences b with
  /// masked[b] get masked picks (on a stage with picks_masked(): Model::step_masked).
  std::vector<std::vector<float>>
  run(const models::StepInput& in, bool all, const StageInputs& inputs = {},
      std::vector<int32_t>* greedy = nullptr, const StageTransport* transport = nullptr,
      const std::vector<bool>* want = nullptr, const std::vector<bool>* masked = nullptr,
      const MaskSource* mask_source = nullptr);
};

void CudaModel::Impl::upload_weights(const fs::path& cache_dir) {
  // The layout's tensors go up in one streamed pass (runtime/weights: MXFP4 experts are
  // dequantised to BF16 on the GPU, or kept as MXFP4 as the stage layout says), then are looked
  // up by name and checked.
  runtime::UploadOptions o;
  o.cache_dir = cache_dir;
  if (stage.mxfp4_max_scale >= 0) // the MoE gemms scale with one multiply up to it
    o.max_scale = stage.mxfp4_max_scale;
  if (!quiet)
    o.progress = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  std::vector<std::string> names;
  for (const runtime::StageLayout::Weight& w : stage.weights)
    names.push_back(w.name);
  device_weights =
      runtime::DeviceWeights::upload(weight_specs_named(ckpt, names, stage.expert_format), o);
  for (const runtime::StageLayout::Weight& w : stage.weights) {
    const std::string& name = w.name;
    const runtime::DeviceTensor* t = device_weights.find(name);
    uint64_t numel = 1;
    for (int64_t d : w.shape)
      numel *= static_cast<uint64_t>(d);
    // MXFP4 on the device: 16 bytes of blocks and one scale byte per 32 values.
    const bool mx = t && t->dtype == "MXFP4";
    const uint64_t want = mx ? numel / 2 + numel / 32 : numel * 2;
    if (!t || (t->dtype != "BF16" && !mx) || t->bytes != want)
      throw Error(fmt::format("weight '{}': the model wants {} [{}], the checkpoint {}", name,
                              mx ? "MXFP4" : "BF16", fmt::join(w.shape, ", "),
                              t ? fmt::format("holds {} ({} bytes)", t->dtype, t->bytes)
                                : std::string("has no such tensor")));
    weights[name] = const_cast<void*>(device_weights.get(name));
  }
}

void CudaModel::Impl::size_pools(const CudaModelOptions& o) {
  const int64_t ring = kv.ring_blocks();
  const uint64_t fb = dev->kv_block_bytes(), wb = dev->window_block_bytes();
  const bool rows = o.kv_blocks <= 0 && o.kv_memory == 0 && o.gpu_memory_utilization <= 0;
  int64_t blocks = 0, wblocks = 0;
  if (rows) { // fixed rows: max_batch sequences of max_seq positions, and the null block
    blocks = max_batch * kv.table_blocks + 1;
    // Rings of `ring` blocks a row, or, in the engine, a step's reads and writes for each.
    wblocks = kv.window > 0 ? 2 * max_batch * ring + 1 : 0;
  } else {
    // The window pool: each running sequence reads a window of `ring` blocks and a step writes
    // up to as many more; twice that over max_batch, and a prompt chunk's worth, leaves room
    // for cached prefixes' windows.
    wblocks = kv.window == 0        ? 0
              : o.window_blocks > 0 ? o.window_blocks
                                    : 2 * max_batch * ring + int64_t(tcap) / kv.block_size + 1;
    blocks = o.kv_blocks;
    uint64_t budget = o.kv_memory;
    if (blocks <= 0 && budget == 0) {
      // What the process may hold in all is gpu_memory_utilization of the GPU (vLLM's rule):
      // less what is in use now (the weights, the arena, anything else on the GPU) and a
      // reserve for what is still to come (decode graphs, the libraries' workspaces).
      const auto [free_b, total_b] = runtime::device_memory();
      const auto allowed = uint64_t(double(total_b) * o.gpu_memory_utilization);
      const uint64_t used = total_b - free_b, reserve = uint64_t(1) << 30;
      budget = allowed > used + reserve ? allowed - used - reserve : 0;
      log(fmt::format("KV memory: {:.0f}% of {:.2f} GiB is {:.2f} GiB; {:.2f} GiB in use, {:.2f} "
                      "GiB kept for graphs and workspaces: {:.2f} GiB for the KV pools",
                      100 * o.gpu_memory_utilization, double(total_b) / (1ull << 30),
                      double(allowed) / (1ull << 30), double(used) / (1ull << 30),
                      double(reserve) / (1ull << 30), double(budget) / (1ull << 30)));
    }
    if (blocks <= 0) {
      const uint64_t window_bytes = uint64_t(wblocks) * wb,
                     one = uint64_t(kv.table_blocks + 1) * fb;
      if (budget < window_bytes + one)
        throw Error(fmt::format("{:.2f} GiB of KV memory cannot hold one sequence of {} positions "
                                "({:.2f} GiB with the sliding-window pool): give more KV memory "
                                "(--kv-memory, --gpu-memory-utilization), or compile with a "
                                "smaller --max-seq",
                                double(budget) / (1ull << 30), max_seq,
                                double(window_bytes + one) / (1ull << 30)));
      blocks = int64_t((budget - window_bytes) / std::max<uint64_t>(fb, 1));
      // More than four times what max_batch sequences of max_seq hold is no use (a small model
      // on a large GPU): the rest stays free.
      const int64_t most = 4 * max_batch * kv.table_blocks + 1;
      if (blocks > most) {
        log(fmt::format("KV pool capped at {} blocks (4 x max batch {} x {} positions); {:.2f} GiB "
                        "of the budget left unused",
                        most, max_batch, max_seq,
                        double(uint64_t(blocks - most) * fb) / (1ull << 30)));
        blocks = most;
      }
    }
  }
  dev->allocate_pools(blocks, wblocks);
  kv.blocks = blocks;
  kv.window_blocks = wblocks;
}

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
  m.stage = std::move(program.layout);
  m.max_batch = m.stage.max_batch;
  m.max_seq = m.stage.max_seq;
  if (m.max_batch < 1 || m.max_seq < 1 || m.stage.tokens < 8 || m.stage.tokens > (1 << 24))
    throw Error(fmt::format("{}: a stage layout for max batch {}, max sequence {} and {} tokens "
                            "per step cannot run",
                            program.source, m.max_batch, m.max_seq, m.stage.tokens));
  m.tcap = static_cast<int>(m.stage.tokens);
  m.log(fmt::format("{} ({}, {} SMs, {:.0f} GiB)", dev.name, dev.arch(), dev.multiprocessors,
                    double(dev.memory_bytes) / (1ull << 30)));
  m.per_token = m.stage.output.per_token;
  m.sends = m.stage.output.sends;
  m.vocab = m.stage.output.vocab;

  m.kv.block_size = m.stage.kv_block;
  m.kv.table_blocks = m.stage.table_blocks;
  m.kv.window = m.stage.window;
  m.layout = ParamLayout(static_cast<size_t>(m.tcap), static_cast<size_t>(m.max_batch),
                         static_cast<size_t>(m.kv.table_blocks), m.kv.window > 0);
  runtime::DeviceStageOptions so;
  so.quiet = options.quiet;
  so.cuda_graphs = options.cuda_graphs;
  so.capture_at_start = options.capture_at_start;
  so.dependent_launch = options.dependent_launch;
  so.profile = options.profile;
  so.repeat_kernel = options.repeat_kernel;
  so.repeat_times = options.repeat_times;
  m.dev = std::make_unique<runtime::DeviceStage>(m.stage, m.layout.offset, m.layout.total, so);

  auto t1 = std::chrono::steady_clock::now();
  m.log("loading weights ...");
  m.upload_weights(options.cache_dir);
  m.log(fmt::format("loaded {} weight tensors, {:.2f} GB on the GPU, {:.1f} s", m.weights.size(),
                    double(m.device_weights.device_bytes()) / 1e9, seconds_since(t1)));
  m.size_pools(options);
  m.log(kv::pool_summary(m.kv, m.dev->kv_block_bytes(), m.dev->window_block_bytes()));
  m.dev->load(std::move(program.table), program.cubins, m.weights, program.source, program.compiled,
              program.load_ms);
  m.log(fmt::format(
      "ready: {} launch table entries{}, arena {:.1f} MiB, {:.2f} GB in all, {:.1f} s",
      m.dev->entries(), options.cuda_graphs && !options.profile ? " (decode as CUDA graphs)" : "",
      double(m.stage.arena_bytes) / (1 << 20),
      double(m.dev->allocated_bytes() + m.device_weights.device_bytes()) / 1e9, seconds_since(t0)));
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

const models::KvGeometry& CudaModel::kv_geometry() const {
  return impl_->kv;
}
std::vector<float> CudaModel::read_activation(uint64_t offset, size_t count) const {
  return impl_->dev->read_arena(offset, count);
}
void CudaModel::reset() {
  impl_->dev->reset();
}
void CudaModel::synchronize() {
  impl_->dev->synchronize();
}
size_t CudaModel::graphs_captured() const {
  return impl_->dev->graphs_captured();
}
bool CudaModel::picks_greedy() const {
  return impl_->dev->picks_greedy();
}

namespace {

/// A Stopwatch of CUDA events on the model's stream (runtime::EventTimer).
class EventStopwatch : public Stopwatch {
public:
  explicit EventStopwatch(runtime::Stream stream) : timer_(stream) {}
  void start() override { timer_.start(); }
  double stop() override { return timer_.stop(); }

private:
  runtime::EventTimer timer_;
};

} // namespace

std::unique_ptr<Stopwatch> CudaModel::stopwatch() {
  return std::make_unique<EventStopwatch>(impl_->dev->stream());
}

double CudaModel::peak_memory_gib() const {
  return double(impl_->dev->allocated_bytes() + impl_->device_weights.device_bytes()) /
         double(1ull << 30);
}

void CudaModel::Impl::run_substep(const models::StepInput& sub,
                                  std::vector<std::vector<float>>& rows, bool all,
                                  std::vector<int32_t>* greedy, const StageInputs& inputs,
                                  const std::vector<size_t>& input_rows,
                                  const StageTransport* transport,
                                  const std::vector<bool>* want_rows,
                                  const std::function<size_t(uint32_t*, int32_t*)>* masks) {
  // A decode sub-step runs at its padded batch (runtime::decode_batch_bucket), so that a few
  // captured graphs serve every batch, on every rank of a pipeline alike: the padding
  // sequences decode token 0 at position 0 into the null block, and their rows are dropped.
  const int real = static_cast<int>(sub.tokens.size());
  const bool decode = std::all_of(sub.tokens.begin(), sub.tokens.end(),
                                  [](const auto& t) { return t.size() == 1; });
  const int padded = decode
                         ? runtime::decode_batch_bucket(
                               real, static_cast<int>(std::min<int64_t>(max_batch, int64_t(tcap))))
                         : real;
  models::StepInput pad;
  const models::StepInput* step = &sub;
  if (padded > real) {
    pad = sub;
    pad.copies.clear();
    for (int b = real; b < padded; ++b) {
      pad.tokens.push_back({0});
      pad.ctx_lens.push_back(0);
      pad.block_tables.push_back({0});
      if (!pad.window_tables.empty())
        pad.window_tables.push_back({0});
    }
    step = &pad;
  }
  const std::map<std::string, ir::Tensor> p = models::step_params(*step);
  const int tokens = static_cast<int>(p.at(models::params::kTokenIds).numel());
  const int seqs = static_cast<int>(step->tokens.size());
  int32_t* params_host = dev->params();
  runtime::SubStep s;
  // The per-token and per-sequence inputs, then each table's rows at the layout's stride (the
  // parts of the block the step uses are all that goes up).
  const size_t mb = layout.table_blocks;
  for (const auto& [name, off] : layout.offset) {
    const bool table = name == models::params::kBlockTable || name == models::params::kWindowTable;
    if (!table) {
      const std::vector<int32_t>& src = p.at(name).i;
      std::copy(src.begin(), src.end(), params_host + off);
      s.params.push_back({off, src.size()});
      continue;
    }
    const auto& tables =
        name == models::params::kBlockTable ? step->block_tables : step->window_tables;
    for (size_t b = 0; b < tables.size(); ++b) {
      int32_t* row = params_host + off + b * mb;
      const size_t n = std::min(tables[b].size(), mb);
      std::copy(tables[b].begin(), tables[b].begin() + std::ptrdiff_t(n), row);
      std::fill(row + n, row + mb, -1);
    }
    s.params.push_back({off, tables.size() * mb});
  }
  s.shape.tokens = tokens;
  s.shape.seqs = seqs;
  for (int32_t pos : p.at(models::params::kPositions).i)
    s.shape.max_pos = std::max(s.shape.max_pos, pos);
  // The leading sequences of one token each (the scheduler's decodes come first).
  while (s.shape.decodes < seqs && step->tokens[size_t(s.shape.decodes)].size() == 1)
    ++s.shape.decodes;
  // A pipeline stage's received activations: this sub-step's rows of each recv value.
  for (const auto& [name, full] : inputs) {
    const uint64_t base = recv(name).offset;
    for (size_t i = 0; i < input_rows.size(); ++i) {
      const std::vector<float>& row = full.at(input_rows[i]);
      s.uploads.push_back(
          {base + i * row.size() * sizeof(float), row.data(), row.size() * sizeof(float)});
    }
  }
  s.transport = transport;
  // Output rows of the real sequences only (padding sequences come last, one token each).
  const size_t n = static_cast<size_t>(per_token ? tokens - (seqs - real) : real);
  const size_t v = static_cast<size_t>(vocab);
  s.rows = n;
  const std::vector<int32_t>& last = p.at(models::params::kLogitRows).i;
  s.keys = greedy != nullptr; // greedy is only set when the sampling epilogue exists
  if (greedy && masks)
    s.masks = *masks;
  if (greedy && want_rows) // the logits rows a sampling request needs
    for (size_t b = 0; b < static_cast<size_t>(real); ++b)
      if ((*want_rows)[b])
        s.wanted.push_back(per_token ? static_cast<size_t>(last[b]) : b);
  dev->run(s);
  if (transport && sends)
    return; // sent on to the next stage: nothing came back
  const float* out_host = dev->output_host();
  if (greedy) {
    const uint64_t* keys = dev->keys_host();
    const int chunks = dev->argmax_chunks();
    for (size_t b = 0; b < n; ++b)
      greedy->push_back(runtime::argmax_of_keys(keys + b * chunks, chunks));
    static_assert(runtime::kArgmaxNonFinite == kNonFinite,
                  "a non-finite row's greedy pick is the engine's marker");
    if (want_rows)
      for (size_t b = 0; b < static_cast<size_t>(real); ++b) {
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
  for (size_t b = 0; b < static_cast<size_t>(real); ++b) {
    const size_t r = per_token ? static_cast<size_t>(last[b]) : b;
    rows.emplace_back(out_host + r * v, out_host + (r + 1) * v);
  }
}

std::vector<std::vector<float>>
CudaModel::Impl::run(const models::StepInput& in, bool all, const StageInputs& inputs,
                     std::vector<int32_t>* greedy, const StageTransport* transport,
                     const std::vector<bool>* want, const std::vector<bool>* masked,
                     const MaskSource* mask_source) {
  Impl& m = *this;
  XSERV_CHECK(!masked || (greedy && mask_source && dev->picks_masked() && !per_token),
              "masked picks need the sampling epilogue's masked pick");
  validate_step(in, m.max_batch, m.max_seq, m.ckpt.config().vocab_size, m.kv);
  for (const models::StepInput::BlockCopy& c : in.copies)
    m.dev->copy_block(c.window, c.src, c.dst);
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
    // Structured output: the pieces ending a masked sequence; their rows are the pieces'
    // places in the sub-step (the epilogue's output has one row per sequence).
    std::vector<size_t> masked_pieces;
    if (masked)
      for (size_t i = 0; i < pieces.size(); ++i)
        if ((*masked)[pieces[i].seq] && ends_sequence(in, pieces[i]))
          masked_pieces.push_back(i);
    const size_t words = size_t(dev->mask_words());
    const std::function<size_t(uint32_t*, int32_t*)> fill_masks = [&](uint32_t* staging,
                                                                      int32_t* rows_out) {
      const std::vector<std::vector<uint32_t>>& all_masks = (*mask_source)();
      XSERV_CHECK(all_masks.size() == in.tokens.size(), "step_masked: one mask per sequence");
      for (size_t n = 0; n < masked_pieces.size(); ++n) {
        const std::vector<uint32_t>& mask = all_masks[pieces[masked_pieces[n]].seq];
        XSERV_CHECK(
            mask.size() == words,
            fmt::format("a token mask of {} words; the vocabulary takes {}", mask.size(), words));
        std::copy(mask.begin(), mask.end(), staging + n * words);
        rows_out[n] = static_cast<int32_t>(masked_pieces[n]);
      }
      return masked_pieces.size();
    };
    m.run_substep(sub, rows, all, greedy ? &ids : nullptr, inputs, input_rows, transport,
                  want ? &want_rows : nullptr, masked_pieces.empty() ? nullptr : &fill_masks);
    if (transport && m.sends)
      continue; // sent on the device: nothing comes back
    // A masked pick whose id the mask does not allow: the mask allowed none (every key 0).
    for (size_t i : masked_pieces) {
      const std::vector<uint32_t>& mask = (*mask_source)()[pieces[i].seq];
      const int32_t id = ids[i];
      if (id >= 0 && (size_t(id) / 32 >= mask.size() || !(mask[size_t(id) / 32] >> (id % 32) & 1u)))
        ids[i] = kNoneAllowed;
    }
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
  if (!impl_->dev->picks_greedy())
    return Model::step_mixed(in, need_logits);
  XSERV_CHECK(need_logits.size() == in.tokens.size(), "step_mixed: one flag per sequence");
  // Greedy picks on the GPU for every sequence; only the wanted logits rows come back.
  engine::StepOutput out;
  out.logits = impl_->run(in, false, {}, &out.greedy, nullptr, &need_logits);
  return out;
}

engine::StepOutput CudaModel::step_masked(const models::StepInput& in,
                                          const std::vector<bool>& need_logits,
                                          const std::vector<bool>& masked,
                                          const MaskSource& masks) {
  if (!picks_masked())
    return Model::step_masked(in, need_logits, masked, masks);
  XSERV_CHECK(need_logits.size() == in.tokens.size() && masked.size() == in.tokens.size(),
              "step_masked: one flag per sequence");
  engine::StepOutput out;
  out.logits = impl_->run(in, false, {}, &out.greedy, nullptr, &need_logits, &masked, &masks);
  return out;
}

bool CudaModel::picks_masked() const {
  return impl_->dev->picks_greedy() && impl_->dev->picks_masked() && !impl_->per_token;
}

std::vector<int32_t> CudaModel::step_greedy(const models::StepInput& in) {
  if (!impl_->dev->picks_greedy())
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
  if (!impl_->dev->picks_greedy())
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

bool CudaModel::all_rows() const {
  return impl_->per_token && !impl_->sends; // logits, not a stage's activations
}

std::vector<std::vector<float>> CudaModel::step_all(const models::StepInput& in) {
  if (!impl_->per_token)
    throw Error("step_all needs a graph that returns every token's logits");
  return impl_->run(in, true);
}

} // namespace xserv::engine
