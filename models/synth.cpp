// Synthetic checkpoint writer: deterministic counter-based random weights, generated in
// parallel chunks and written with pwrite straight into each shard.
//
// 1. Lay out expected_tensors(config) in order, packing shards greedily up to shard_size.
// 2. Per shard: write the header, split every tensor into chunks of kChunkElems elements and
//    let a pool of threads generate each chunk from its own stream (seed, name, chunk) and
//    pwrite it at its final offset; only the calling thread reports progress.
// 3. Write the index and config.json, then rename the temporaries into place.
// Before anything is written the total size is checked against the free space; a failure or
// SIGINT/SIGTERM/SIGHUP while writing removes every temporary.
#include "models/synth.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <mutex>
#include <numbers>
#include <thread>
#include <vector>

#include <csignal>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "models/bf16.h"
#include "models/checkpoint.h"
#include "models/safetensors.h"

namespace xserv::models {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int64_t kChunkElems = int64_t{1} << 20;

enum class Kind { Matrix, Bias, Norm, Sink, Router, Blocks, Scales };

struct Tensor {
  TensorSpec spec;
  Kind kind;
  uint64_t hash;       ///< of the name: the stream key
  uint64_t size;       ///< bytes
  uint64_t offset = 0; ///< absolute in its shard
};

struct Shard {
  std::string name;
  std::vector<size_t> tensors;
  uint64_t bytes = 0;
};

uint64_t mix64(uint64_t z) { // splitmix64's finaliser: a bijection with full avalanche
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s)
    h = (h ^ c) * 0x100000001B3ull;
  return h;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Kind kind_of(const std::string& name) {
  if (ends_with(name, "_blocks"))
    return Kind::Blocks;
  if (ends_with(name, "_scales"))
    return Kind::Scales;
  if (ends_with(name, "layernorm.weight") || name == "model.norm.weight")
    return Kind::Norm;
  if (ends_with(name, ".sinks"))
    return Kind::Sink;
  if (ends_with(name, "mlp.router.weight"))
    return Kind::Router;
  if (ends_with(name, "bias"))
    return Kind::Bias;
  return Kind::Matrix;
}

/// Fills `out` with chunk `chunk` of tensor `t`: `n` elements starting at chunk * kChunkElems.
void generate(const Tensor& t, int64_t chunk, int64_t n, const SynthOptions& o, uint8_t* out) {
  const uint64_t stream = mix64(mix64(o.seed * 0x9E3779B97F4A7C15ull + t.hash) + uint64_t(chunk));
  uint64_t ctr = stream;
  auto next = [&] { return mix64(ctr += 0x9E3779B97F4A7C15ull); };
  if (t.kind == Kind::Blocks) {
    for (int64_t i = 0; i < n; i += 8) {
      uint64_t x = next();
      for (int64_t k = 0; k < 8 && i + k < n; ++k)
        out[i + k] = static_cast<uint8_t>(x >> (8 * k));
    }
    return;
  }
  if (t.kind == Kind::Scales) {
    auto range = static_cast<uint64_t>(o.expert_scale_hi - o.expert_scale_lo);
    for (int64_t i = 0; i < n; i += 2) {
      uint64_t x = next();
      out[i] = static_cast<uint8_t>(o.expert_scale_lo + (((x & 0xFFFFFFFF) * range) >> 32));
      if (i + 1 < n)
        out[i + 1] = static_cast<uint8_t>(o.expert_scale_lo + (((x >> 32) * range) >> 32));
    }
    return;
  }
  float mean = t.kind == Kind::Norm ? 1.0f : 0.0f;
  float std = t.kind == Kind::Matrix ? o.matrix_std
              : t.kind == Kind::Bias ? o.bias_std
              : t.kind == Kind::Norm ? o.norm_std
              : t.kind == Kind::Sink ? o.sink_std
                                     : o.router_std;
  auto put = [&](int64_t i, float v) {
    uint16_t b = float_to_bf16(mean + std * v);
    out[2 * i] = static_cast<uint8_t>(b);
    out[2 * i + 1] = static_cast<uint8_t>(b >> 8);
  };
  for (int64_t i = 0; i < n; i += 2) { // Box-Muller: one 64-bit draw gives two normals
    uint64_t x = next();
    float u1 = static_cast<float>((x >> 40) + 1) * 0x1p-24f; // (0, 1]: log stays finite
    float u2 = static_cast<float>(x & 0xFFFFFF) * 0x1p-24f;
    float r = std::sqrt(-2.0f * std::log(u1)), a = 2.0f * std::numbers::pi_v<float> * u2;
    put(i, r * std::cos(a));
    if (i + 1 < n)
      put(i + 1, r * std::sin(a));
  }
}

void write_all(int fd, const uint8_t* p, size_t n, uint64_t off, const fs::path& path) {
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      throw Error(fmt::format("{}: cannot write: {}", path.string(), std::strerror(errno)));
    p += w;
    n -= static_cast<size_t>(w);
    off += static_cast<uint64_t>(w);
  }
}

/// "4.9 GB", "12.3 MB": progress lines stay readable for tiny and full-size checkpoints.
std::string human(double bytes) {
  if (bytes >= 1e9)
    return fmt::format("{:.1f} GB", bytes / 1e9);
  return bytes >= 1e6 ? fmt::format("{:.1f} MB", bytes / 1e6)
                      : fmt::format("{:.1f} KB", bytes / 1e3);
}

struct Item {
  size_t tensor;
  int64_t chunk, elems;
  uint64_t offset;
};

/// Generates and writes every chunk of `shard` into `fd` with `threads` threads.
void fill_shard(int fd, const fs::path& path, const std::vector<Tensor>& tensors,
                const Shard& shard, const SynthOptions& o, int threads, const std::string& label) {
  std::vector<Item> items;
  for (size_t ti : shard.tensors) {
    const Tensor& t = tensors[ti];
    int64_t numel = 1, esize = t.spec.dtype == "BF16" ? 2 : 1;
    for (int64_t d : t.spec.shape)
      numel *= d;
    for (int64_t c = 0; c * kChunkElems < numel; ++c)
      items.push_back({ti, c, std::min(kChunkElems, numel - c * kChunkElems),
                       t.offset + static_cast<uint64_t>(c * kChunkElems * esize)});
  }
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> done{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::exception_ptr error;
  auto t0 = Clock::now(), last = t0;
  auto work = [&](bool reporter) {
    std::vector<uint8_t> buf(static_cast<size_t>(kChunkElems * 2));
    try {
      for (size_t i; !stop && (i = next.fetch_add(1)) < items.size();) {
        const Item& it = items[i];
        const Tensor& t = tensors[it.tensor];
        generate(t, it.chunk, it.elems, o, buf.data());
        size_t n = static_cast<size_t>(it.elems * (t.spec.dtype == "BF16" ? 2 : 1));
        write_all(fd, buf.data(), n, it.offset, path);
        uint64_t total = done += n;
        if (reporter && o.progress && Clock::now() - last > std::chrono::seconds(2)) {
          last = Clock::now();
          double s = std::chrono::duration<double>(last - t0).count();
          o.progress(fmt::format("{}: {} of {}, {}/s", label, human(double(total)),
                                 human(double(shard.bytes)), human(double(total) / s)));
        }
      }
    } catch (...) {
      std::lock_guard lock(mu);
      if (!error)
        error = std::current_exception();
      stop = true;
    }
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i)
    pool.emplace_back(work, false);
  work(true);
  for (std::thread& th : pool)
    th.join();
  if (error)
    std::rethrow_exception(error);
  if (o.progress) {
    double s = std::max(1e-9, std::chrono::duration<double>(Clock::now() - t0).count());
    o.progress(fmt::format("{}: {}, {}/s", label, human(double(shard.bytes)),
                           human(double(shard.bytes) / s)));
  }
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.flush())
    throw Error(fmt::format("{}: cannot write", path.string()));
}

/// Paths the signal handler unlinks: set before the handler is installed, unchanged while it is.
std::atomic<const std::vector<std::string>*> g_temporaries{nullptr};

extern "C" void remove_temporaries_and_die(int sig) {
  if (const std::vector<std::string>* temps = g_temporaries.load())
    for (const std::string& p : *temps)
      ::unlink(p.c_str()); // async-signal-safe; c_str() of an unchanging string allocates nothing
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

/// While alive, SIGINT, SIGTERM and SIGHUP remove `temps` before the process dies of them.
class TemporariesGuard {
public:
  explicit TemporariesGuard(const std::vector<std::string>& temps) {
    g_temporaries.store(&temps);
    struct sigaction sa {};
    sa.sa_handler = remove_temporaries_and_die;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < std::size(kSignals); ++i)
      ::sigaction(kSignals[i], &sa, &old_[i]);
  }
  ~TemporariesGuard() {
    for (size_t i = 0; i < std::size(kSignals); ++i)
      ::sigaction(kSignals[i], &old_[i], nullptr);
    g_temporaries.store(nullptr);
  }
  TemporariesGuard(const TemporariesGuard&) = delete;
  TemporariesGuard& operator=(const TemporariesGuard&) = delete;

private:
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
  struct sigaction old_[std::size(kSignals)]{};
};

/// The nearest existing directory at or above `p`, where free space is measured.
fs::path existing_ancestor(fs::path p) {
  p = fs::absolute(p);
  std::error_code ec;
  while (!p.empty() && !fs::exists(p, ec) && p.has_parent_path() && p.parent_path() != p)
    p = p.parent_path();
  return p;
}

} // namespace

void synth_checkpoint(const ModelConfig& config, const fs::path& out_dir, const SynthOptions& o) {
  // 0xFF is E8M0's NaN, which loaders refuse.
  if (o.expert_scale_lo < 0 || o.expert_scale_hi > 255 || o.expert_scale_lo >= o.expert_scale_hi)
    throw Error(fmt::format("synth: expert scale range [{}, {}) must be a non-empty part of "
                            "[0, 255) (0xFF is NaN)",
                            o.expert_scale_lo, o.expert_scale_hi));
  if (o.shard_size == 0 || o.threads < 0)
    throw Error("synth: shard_size must be positive and threads non-negative");
  ModelConfig cfg = config;
  cfg.quant_method = "mxfp4";

  std::vector<Tensor> tensors;
  for (ExpectedTensor& e : expected_tensors(cfg)) {
    Tensor t{{e.name, e.dtype, e.shape}, kind_of(e.name), fnv1a(e.name), 0};
    t.size = static_cast<uint64_t>(TensorInfo{e.name, e.dtype, e.shape, 0, 0}.numel()) *
             static_cast<uint64_t>(safetensors_dtype_bits(e.dtype) / 8);
    tensors.push_back(std::move(t));
  }
  std::vector<Shard> shards;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (shards.empty() ||
        (!shards.back().tensors.empty() && shards.back().bytes + tensors[i].size > o.shard_size))
      shards.emplace_back();
    shards.back().tensors.push_back(i);
    shards.back().bytes += tensors[i].size;
  }

  // Names and headers first: the total size is known before a byte is written.
  std::vector<std::string> headers;
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total = 0, on_disk = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    Shard& shard = shards[s];
    shard.name = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    std::vector<TensorSpec> specs;
    for (size_t ti : shard.tensors)
      specs.push_back(tensors[ti].spec);
    headers.push_back(make_safetensors_header(specs, {{"format", "pt"}}));
    uint64_t off = headers.back().size();
    for (size_t ti : shard.tensors) {
      tensors[ti].offset = off;
      off += tensors[ti].size;
      weight_map[tensors[ti].spec.name] = shard.name;
    }
    total += shard.bytes;
    on_disk += off;
  }
  std::error_code ec;
  const fs::space_info space = fs::space(existing_ancestor(out_dir), ec);
  const uint64_t margin = 64ull << 20; // index, config and file system slack
  if (!ec && space.available < on_disk + margin)
    throw Error(fmt::format("{}: the checkpoint needs {} but only {} are free there; nothing was "
                            "written",
                            out_dir.string(), human(double(on_disk)),
                            human(double(space.available))));

  fs::create_directories(out_dir, ec);
  if (ec)
    throw Error(fmt::format("{}: cannot create directory: {}", out_dir.string(), ec.message()));
  if (fs::exists(out_dir / "model.safetensors"))
    throw Error(fmt::format("{}: already holds model.safetensors, which readers would prefer to "
                            "the shards synth writes; remove it first",
                            out_dir.string()));
  int threads = o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::pair<fs::path, fs::path>> renames; // temporary -> final
  for (const Shard& shard : shards)
    renames.emplace_back(out_dir / (shard.name + ".tmp"), out_dir / shard.name);
  for (const char* name : {"model.safetensors.index.json", "config.json"})
    renames.emplace_back(out_dir / (std::string(name) + ".tmp"), out_dir / name);
  std::vector<std::string> temporaries;
  for (const auto& r : renames)
    temporaries.push_back(r.first.string());
  const TemporariesGuard guard(temporaries);
  try {
    for (size_t s = 0; s < shards.size(); ++s) {
      const Shard& shard = shards[s];
      const std::string& header = headers[s];
      fs::path path = renames[s].first;
      int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0)
        throw Error(fmt::format("{}: cannot create: {}", path.string(), std::strerror(errno)));
      try {
        write_all(fd, reinterpret_cast<const uint8_t*>(header.data()), header.size(), 0, path);
        fill_shard(fd, path, tensors, shard, o, threads,
                   fmt::format("shard {}/{}", s + 1, shards.size()));
      } catch (...) {
        ::close(fd);
        throw;
      }
      if (::close(fd) != 0)
        throw Error(fmt::format("{}: cannot write: {}", path.string(), std::strerror(errno)));
    }
    nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_text(renames[shards.size()].first, index.dump(2) + "\n");
    write_text(renames[shards.size() + 1].first, cfg.to_json().dump(2) + "\n");
    for (const auto& [from, to] : renames) {
      fs::rename(from, to, ec);
      if (ec)
        throw Error(
            fmt::format("{}: cannot rename to {}: {}", from.string(), to.string(), ec.message()));
    }
  } catch (...) {
    for (const auto& [from, to] : renames)
      fs::remove(from, ec);
    throw;
  }
}

} // namespace xserv::models
