// DeviceWeights::upload: mmap the files, then stream them to the GPU through pinned staging
// buffers filled by host threads, MXFP4 chunks dequantised in place by an NVRTC kernel.
//
// 1. layout_weights() checks the specs and places every tensor in one arena (256-byte aligned).
// 2. Each file is opened and mapped once; every source range is checked against its size.
// 3. The work is cut into batches of at most one staging buffer: Copy tensors and runs of MXFP4
//    blocks (with their scales) are packed back to back, large tensors split across batches.
// 4. For batch i, in buffer i % K: wait for that buffer's event, fill it with all host threads
//    (memcpy from the mappings), then queue on one copy stream the host-to-device copies (Copy
//    data straight into the arena; MXFP4 data into the buffer's device twin, followed by the
//    dequant kernel writing BF16 into the arena) and record the event. The GPU drains batch i
//    while the host fills batch i+1.
#include "runtime/weights.h"

#include "base/error.h"
#include "runtime/device.h"
#include "runtime/kernel_cache.h"
#include "runtime/module.h"
#include "runtime/nvrtc.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <memory>
#include <mutex>
#include <sys/mman.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

namespace xserv::runtime {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

uint64_t align_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

void cuda_check(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw Error("weight upload: " + what + " failed: " + cudaGetErrorString(err));
  }
}

/// One file mapped read-only (MAP_SHARED, so the page cache is used as is).
struct MappedFile {
  std::string path;
  int fd = -1;
  const uint8_t* data = nullptr;
  uint64_t size = 0;

  MappedFile() = default;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() {
    if (data)
      munmap(const_cast<uint8_t*>(data), size);
    if (fd >= 0)
      close(fd);
  }
};

/// Maps every file the specs name, once each, and checks each source range lies inside it.
class FileMaps {
public:
  explicit FileMaps(const std::vector<WeightSpec>& specs) {
    for (const WeightSpec& spec : specs) {
      check(spec, spec.data);
      if (spec.scales)
        check(spec, *spec.scales);
    }
  }
  size_t count() const { return files_.size(); }
  /// The mapped bytes of `src` (already checked).
  const uint8_t* bytes(const WeightSource& src) const {
    return files_.at(src.file)->data + src.offset;
  }

private:
  const MappedFile& map(const WeightSpec& spec, const WeightSource& src) {
    auto it = files_.find(src.file);
    if (it != files_.end())
      return *it->second;
    auto f = std::make_unique<MappedFile>();
    f->path = src.file;
    f->fd = open(src.file.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (f->fd < 0 || fstat(f->fd, &st) != 0)
      throw Error("weight '" + spec.name + "': cannot open " + src.file + ": " +
                  std::strerror(errno));
    if (!S_ISREG(st.st_mode))
      throw Error("weight '" + spec.name + "': " + src.file + " is not a regular file");
    f->size = uint64_t(st.st_size);
    if (f->size > 0) {
      void* p = mmap(nullptr, f->size, PROT_READ, MAP_SHARED, f->fd, 0);
      if (p == MAP_FAILED)
        throw Error("weight '" + spec.name + "': cannot map " + src.file + " (" +
                    std::to_string(f->size) + " bytes): " + std::strerror(errno));
      f->data = static_cast<const uint8_t*>(p);
    }
    return *files_.emplace(src.file, std::move(f)).first->second;
  }

  void check(const WeightSpec& spec, const WeightSource& src) {
    const MappedFile& f = map(spec, src);
    if (src.offset > f.size || src.bytes > f.size - src.offset)
      throw Error("weight '" + spec.name + "': tensor '" + src.name + "' needs bytes [" +
                  std::to_string(src.offset) + ", " + std::to_string(src.offset + src.bytes) +
                  ") of " + src.file + ", which has only " + std::to_string(f.size) +
                  " bytes (truncated file or wrong offset)");
  }

  std::map<std::string, std::unique_ptr<MappedFile>> files_;
};

/// A host copy from a mapping into a staging buffer at byte `stage`.
struct Piece {
  const uint8_t* src;
  uint64_t bytes;
  uint64_t stage;
};

/// GPU work for one staged range: a copy into the arena, or a copy into the device twin of
/// the staging buffer followed by the dequant kernel.
struct Op {
  bool dequant = false;
  uint64_t stage = 0;  ///< start in the staging buffer
  uint64_t bytes = 0;  ///< bytes to move host -> device
  uint64_t dst = 0;    ///< arena offset of the output
  uint64_t scales = 0; ///< dequant: staging offset of the scales
  uint64_t nblocks = 0;
};

/// The contents of one staging buffer.
struct Batch {
  std::vector<Piece> pieces;
  std::vector<Op> ops;
  uint64_t staged = 0;     ///< end of the used part of the buffer
  uint64_t host_bytes = 0; ///< sum of piece bytes
  uint64_t out_bytes = 0;  ///< bytes this batch writes into the arena
};

/// Packs Copy ranges and MXFP4 block runs into staging-buffer-sized batches.
class BatchBuilder {
public:
  explicit BatchBuilder(uint64_t capacity) : cap_(capacity) {}

  void add_copy(const uint8_t* src, uint64_t bytes, uint64_t dst) {
    while (bytes > 0) {
      uint64_t at = start(std::min<uint64_t>(bytes, kMinPiece));
      uint64_t n = std::min(bytes, cap_ - at);
      cur_.pieces.push_back({src, n, at});
      cur_.ops.push_back({false, at, n, dst, 0, 0});
      finish(at + n, n, n);
      src += n, bytes -= n, dst += n;
    }
  }

  void add_mxfp4(const uint8_t* blocks, const uint8_t* scales, uint64_t nblocks, uint64_t dst) {
    while (nblocks > 0) {
      // A run of n blocks needs 16n bytes, then (aligned) n scale bytes.
      auto fits = [&](uint64_t at) {
        uint64_t room = cap_ - at;
        return room > kAlign ? (room - kAlign) / 17 : 0;
      };
      uint64_t at = start(0);
      if (fits(at) < std::min<uint64_t>(nblocks, kMinPiece / 17)) {
        flush();
        at = 0;
      }
      uint64_t n = std::min(nblocks, fits(at));
      uint64_t s = align_up(at + 16 * n, kAlign);
      cur_.pieces.push_back({blocks, 16 * n, at});
      cur_.pieces.push_back({scales, n, s});
      cur_.ops.push_back({true, at, s + n - at, dst, s, n});
      finish(s + n, 17 * n, 64 * n);
      blocks += 16 * n, scales += n, nblocks -= n, dst += 64 * n;
    }
  }

  std::vector<Batch> take() {
    flush();
    return std::move(batches_);
  }

private:
  static constexpr uint64_t kAlign = 256;
  static constexpr uint64_t kMinPiece = 1 << 20; ///< no piece smaller than this, unless the rest

  /// The aligned start of the next piece; a new batch when fewer than `need` bytes are left.
  uint64_t start(uint64_t need) {
    uint64_t at = align_up(cur_.staged, kAlign);
    if (at + need > cap_ || at >= cap_) {
      flush();
      at = 0;
    }
    return at;
  }
  void finish(uint64_t end, uint64_t host, uint64_t out) {
    cur_.staged = end;
    cur_.host_bytes += host;
    cur_.out_bytes += out;
  }
  void flush() {
    if (!cur_.ops.empty())
      batches_.push_back(std::move(cur_));
    cur_ = {};
  }

  uint64_t cap_;
  Batch cur_;
  std::vector<Batch> batches_;
};

/// Copies the bytes [lo, hi) of the concatenation of `b`'s pieces into `stage`.
void fill_range(const Batch& b, uint8_t* stage, uint64_t lo, uint64_t hi) {
  uint64_t pos = 0;
  for (const Piece& p : b.pieces) {
    uint64_t a = std::max(lo, pos), z = std::min(hi, pos + p.bytes);
    if (a < z)
      std::memcpy(stage + p.stage + (a - pos), p.src + (a - pos), z - a);
    pos += p.bytes;
    if (pos >= hi)
      break;
  }
}

/// Runs fn(0..n-1) with fn(0) on the calling thread and the others on persistent workers.
class WorkerPool {
public:
  explicit WorkerPool(int n) {
    for (int t = 1; t < n; ++t)
      threads_.emplace_back([this, t] { work(t); });
  }
  ~WorkerPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& th : threads_)
      th.join();
  }
  int size() const { return int(threads_.size()) + 1; }

  void run(const std::function<void(int)>& fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &fn;
      pending_ = int(threads_.size());
      ++generation_;
    }
    wake_.notify_all();
    fn(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
  }

private:
  void work(int t) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_)
          return;
        seen = generation_;
        job = job_;
      }
      (*job)(t);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0)
        done_.notify_one();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

/// The CUDA resources of one upload, released in a safe order (stream drained first) even
/// when the upload throws.
struct Staging {
  cudaStream_t stream = nullptr;
  std::vector<uint8_t*> host;   ///< pinned
  std::vector<uint8_t*> device; ///< device twins, for MXFP4 chunks only
  std::vector<cudaEvent_t> done;
  std::vector<bool> used;

  Staging() = default;
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging() {
    if (stream)
      cudaStreamSynchronize(stream);
    for (cudaEvent_t e : done)
      cudaEventDestroy(e);
    for (uint8_t* p : host)
      cudaFreeHost(p);
    for (uint8_t* p : device)
      cudaFree(p);
    if (stream)
      cudaStreamDestroy(stream);
    cudaGetLastError();
  }
};

std::string gb(double bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f", bytes / 1e9);
  return s;
}

/// The dequant kernel for the current GPU, from the cache when it is there.
Module load_dequant_module(const std::string& arch, const UploadOptions& options, bool* compiled) {
  CompileOptions copts;
  copts.arch = arch;
  std::vector<char> cubin;
  if (options.cache_dir.empty()) {
    cubin = compile_cuda(mxfp4_dequant_source(), "xserv_mxfp4_to_bf16", copts).cubin;
    *compiled = true;
  } else {
    CachedCubin c = get_or_compile(mxfp4_dequant_source(), "xserv_mxfp4_to_bf16", copts,
                                   options.cache_dir, options.progress);
    *compiled = c.compiled;
    cubin = std::move(c.cubin);
  }
  return Module::load(cubin, "xserv_mxfp4_to_bf16");
}

/// Throws when an MXFP4 scale byte is 0xFF, E8M0's NaN, or above `most` (a plan's
/// mxfp4_max_scale); 1 byte per 32 weights: cheap on the host.
void check_scales(const WeightSpec& spec, const uint8_t* scales, int most) {
  const auto* hit = static_cast<const uint8_t*>(std::memchr(scales, 0xFF, spec.scales->bytes));
  if (hit)
    throw Error("weight '" + spec.name + "': scale byte 0xFF (E8M0 NaN) at index " +
                std::to_string(hit - scales) + " of '" + spec.scales->name + "' in " +
                spec.scales->file + ": the checkpoint is corrupt");
  if (most >= 254)
    return;
  uint8_t largest = 0; // a max reduction the compiler vectorises; the index only on failure
  for (uint64_t i = 0; i < spec.scales->bytes; ++i)
    largest = std::max(largest, scales[i]);
  if (largest <= most)
    return;
  for (uint64_t i = 0; i < spec.scales->bytes; ++i)
    if (scales[i] > most)
      throw Error("weight '" + spec.name + "': scale byte " + std::to_string(scales[i]) +
                  " at index " + std::to_string(i) + " of '" + spec.scales->name + "' in " +
                  spec.scales->file + " is past " + std::to_string(most) +
                  ", the largest the plan was compiled for: recompile it from this checkpoint");
}

/// Throws when an MXFP4 value kept as MXFP4 on the device is infinite: a scale byte of 253 or
/// more with a large enough code (the GPU check below sees only dequantised BF16 tensors). Only
/// blocks with such a scale are decoded: 1 byte per 32 weights is scanned.
void check_mxfp4_finite(const WeightSpec& spec, const uint8_t* blocks, const uint8_t* scales) {
  static constexpr float kLut[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (uint64_t i = 0; i < spec.scales->bytes; ++i) {
    if (scales[i] < 253)
      continue;
    for (int j = 0; j < 32; ++j) {
      const uint8_t byte = blocks[i * 16 + uint64_t(j / 2)];
      const int code = (j % 2 ? byte >> 4 : byte) & 7;
      if (std::isinf(std::ldexp(kLut[code], int(scales[i]) - 127)))
        throw Error("weight '" + spec.name + "': element " + std::to_string(i * 32 + uint64_t(j)) +
                    " is infinite (scale byte " + std::to_string(scales[i]) + " of '" +
                    spec.scales->name + "' in " + spec.scales->file +
                    "): the checkpoint holds non-finite weights");
    }
  }
}

/// Scans every BF16 and F32 tensor of the uploaded arena for infinities and NaNs with one
/// kernel launch per tensor, then throws naming the first tensor (in spec order) holding one.
void check_finite(const Module& module, const Kernel& kernel, cudaStream_t stream,
                  const std::vector<WeightSpec>& specs, const WeightLayout& layout,
                  const uint8_t* arena) {
  std::vector<size_t> checked;
  for (size_t i = 0; i < layout.tensors.size(); ++i)
    if (layout.tensors[i].dtype == "BF16" || layout.tensors[i].dtype == "F32")
      checked.push_back(i);
  if (checked.empty())
    return;
  unsigned long long* first = nullptr;
  cuda_check(
      cudaMalloc(reinterpret_cast<void**>(&first), checked.size() * sizeof(unsigned long long)),
      "allocating the value check's results");
  struct Free {
    void* p;
    ~Free() { cudaFree(p); }
  } free_first{first};
  cuda_check(cudaMemsetAsync(first, 0xFF, checked.size() * sizeof(unsigned long long), stream),
             "clearing the value check's results");
  for (size_t k = 0; k < checked.size(); ++k) {
    const DeviceTensor& t = layout.tensors[checked[k]];
    const int bytes = t.dtype == "BF16" ? 2 : 4;
    const unsigned long long n = t.bytes / uint64_t(bytes);
    if (n == 0)
      continue;
    const void* data = arena + t.offset;
    unsigned long long* slot = first + k;
    const unsigned grid = unsigned(std::min<uint64_t>((n + 255) / 256, 4096));
    module.launch(kernel, dim3(grid), dim3(256), 0, stream, data, n, bytes, slot);
  }
  std::vector<unsigned long long> host(checked.size());
  cuda_check(cudaMemcpyAsync(host.data(), first, host.size() * sizeof(unsigned long long),
                             cudaMemcpyDeviceToHost, stream),
             "reading the value check's results");
  cuda_check(cudaStreamSynchronize(stream), "checking the weights' values");
  for (size_t k = 0; k < checked.size(); ++k) {
    if (host[k] == ~0ull)
      continue;
    const size_t i = checked[k];
    const DeviceTensor& t = layout.tensors[i];
    const int bytes = t.dtype == "BF16" ? 2 : 4;
    uint32_t bits = 0;
    cuda_check(cudaMemcpy(&bits, arena + t.offset + host[k] * uint64_t(bytes), size_t(bytes),
                          cudaMemcpyDeviceToHost),
               "reading a non-finite weight");
    const bool nan = bytes == 2 ? (bits & 0x7Fu) != 0 : (bits & 0x7FFFFFu) != 0;
    const WeightSpec& s = specs[i];
    throw Error("weight '" + s.name + "': element " + std::to_string(host[k]) + " is " +
                (nan ? "NaN" : "infinite") +
                (s.transform == WeightSpec::Transform::Mxfp4ToBf16
                     ? " after MXFP4 dequantisation (a scale byte too large for its values)"
                     : "") +
                " (" + s.data.file + "): the checkpoint holds non-finite weights");
  }
}

} // namespace

DeviceWeights DeviceWeights::upload(const std::vector<WeightSpec>& specs,
                                    const UploadOptions& options) {
  const Clock::time_point t_start = Clock::now();
  if (options.staging_bytes < (1u << 20))
    throw Error("weight upload: staging buffers of " + std::to_string(options.staging_bytes) +
                " bytes are too small (at least 1 MiB)");
  if (options.staging_buffers < 2 || options.staging_buffers > 16)
    throw Error("weight upload: " + std::to_string(options.staging_buffers) +
                " staging buffers asked for; use 2..16");
  DeviceWeights w;
  w.layout_ = layout_weights(specs);
  UploadStats& st = w.stats_;
  st.tensors = w.layout_.tensors.size();

  // 1. Files: mapped and checked before the GPU is touched, so bad input fails fast anywhere.
  FileMaps files(specs);
  st.files = files.count();
  for (const WeightSpec& s : specs) {
    if (s.transform == WeightSpec::Transform::Copy ||
        (!options.check_values && options.max_scale >= 254))
      continue;
    check_scales(s, files.bytes(*s.scales), options.max_scale);
    if (options.check_values && s.transform == WeightSpec::Transform::Mxfp4)
      check_mxfp4_finite(s, files.bytes(s.data), files.bytes(*s.scales));
  }
  st.map_s = seconds_since(t_start);

  // 2. The GPU: arena, staging buffers, stream.
  Clock::time_point t0 = Clock::now();
  DeviceInfo dev = probe_device();
  if (!dev.available)
    throw Error("cannot upload weights: no GPU (" + dev.reason + ")");
  int device = 0, major = 0, minor = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
             "reading the compute capability");
  cuda_check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
             "reading the compute capability");
  if (w.layout_.total_bytes > 0) {
    cudaError_t err = cudaMalloc(&w.arena_, w.layout_.total_bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      w.arena_ = nullptr;
      throw Error("cannot allocate " + gb(double(w.layout_.total_bytes)) + " GB on GPU " +
                  std::to_string(device) + " for the weights (" + gb(double(free_b)) +
                  " GB free of " + gb(double(total_b)) + " GB): " + cudaGetErrorString(err));
    }
    if (options.poison) {
      cuda_check(cudaMemset(w.arena_, 0xFF, w.layout_.total_bytes), "poisoning the arena");
      cuda_check(cudaDeviceSynchronize(), "poisoning the arena");
    }
  }
  bool any_mxfp4 = std::any_of(specs.begin(), specs.end(), [](const WeightSpec& s) {
    return s.transform == WeightSpec::Transform::Mxfp4ToBf16;
  });
  const int k_buffers = options.staging_buffers;
  Module module; // declared before the staging so that it outlives any queued launch
  Kernel dequant;
  Staging stg;
  cuda_check(cudaStreamCreateWithFlags(&stg.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  for (int k = 0; k < k_buffers; ++k) {
    void* p = nullptr;
    cuda_check(cudaHostAlloc(&p, options.staging_bytes, cudaHostAllocDefault),
               "allocating a pinned staging buffer of " + std::to_string(options.staging_bytes) +
                   " bytes");
    stg.host.push_back(static_cast<uint8_t*>(p));
    if (any_mxfp4) {
      cuda_check(cudaMalloc(&p, options.staging_bytes), "allocating a device staging buffer");
      stg.device.push_back(static_cast<uint8_t*>(p));
    }
    cudaEvent_t e = nullptr;
    cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    stg.done.push_back(e);
    stg.used.push_back(false);
  }
  st.gpu_init_s = seconds_since(t0);

  // 3. The dequant kernel (and, in the same module, the value check).
  t0 = Clock::now();
  if (any_mxfp4 || options.check_values) {
    module = load_dequant_module("sm_" + std::to_string(major * 10 + minor), options,
                                 &st.kernel_compiled);
    dequant = module.kernel("xserv_mxfp4_to_bf16");
  }
  st.kernel_s = seconds_since(t0);

  // 4. Batches.
  BatchBuilder builder(options.staging_bytes);
  for (size_t i = 0; i < specs.size(); ++i) {
    const WeightSpec& s = specs[i];
    const DeviceTensor& t = w.layout_.tensors[i];
    if (s.transform == WeightSpec::Transform::Copy) {
      builder.add_copy(files.bytes(s.data), s.data.bytes, t.offset);
    } else if (s.transform == WeightSpec::Transform::Mxfp4) { // blocks, then scales
      builder.add_copy(files.bytes(s.data), s.data.bytes, t.offset);
      builder.add_copy(files.bytes(*s.scales), s.scales->bytes, t.offset + s.data.bytes);
    } else
      builder.add_mxfp4(files.bytes(s.data), files.bytes(*s.scales), s.scales->bytes, t.offset);
  }
  const std::vector<Batch> batches = builder.take();
  st.batches = batches.size();

  // 5. Stream.
  int threads = options.host_threads > 0
                    ? options.host_threads
                    : int(std::clamp(std::thread::hardware_concurrency(), 1u, 12u));
  WorkerPool pool(threads);
  const Clock::time_point t_stream = Clock::now();
  Clock::time_point t_report = t_stream;
  uint8_t* arena = static_cast<uint8_t*>(w.arena_);
  auto prefetch = [&](const Batch& b) {
    const uint64_t page = uint64_t(sysconf(_SC_PAGESIZE));
    for (const Piece& p : b.pieces) {
      uintptr_t a = reinterpret_cast<uintptr_t>(p.src) / page * page;
      madvise(reinterpret_cast<void*>(a), reinterpret_cast<uintptr_t>(p.src) + p.bytes - a,
              MADV_WILLNEED);
    }
  };
  if (options.prefetch)
    for (size_t i = 0; i < std::min<size_t>(2, batches.size()); ++i)
      prefetch(batches[i]);
  for (size_t i = 0; i < batches.size(); ++i) {
    const Batch& b = batches[i];
    const size_t k = i % size_t(k_buffers);
    t0 = Clock::now();
    if (stg.used[k])
      cuda_check(cudaEventSynchronize(stg.done[k]), "waiting for a staging buffer");
    st.wait_s += seconds_since(t0);

    t0 = Clock::now();
    uint8_t* host = stg.host[k];
    const uint64_t per = align_up((b.host_bytes + threads - 1) / threads, 4096);
    pool.run([&](int t) {
      uint64_t lo = std::min(b.host_bytes, per * uint64_t(t));
      fill_range(b, host, lo, std::min(b.host_bytes, lo + per));
    });
    st.fill_s += seconds_since(t0);
    st.bytes_read += b.host_bytes;

    for (const Op& op : b.ops) {
      if (!op.dequant) {
        cuda_check(cudaMemcpyAsync(arena + op.dst, host + op.stage, op.bytes,
                                   cudaMemcpyHostToDevice, stg.stream),
                   "copying to the GPU");
        continue;
      }
      uint8_t* dev = stg.device[k];
      cuda_check(cudaMemcpyAsync(dev + op.stage, host + op.stage, op.bytes, cudaMemcpyHostToDevice,
                                 stg.stream),
                 "copying MXFP4 blocks to the GPU");
      const auto* blocks = reinterpret_cast<const uint4*>(dev + op.stage);
      const auto* scales = reinterpret_cast<const unsigned char*>(dev + op.scales);
      auto* out = reinterpret_cast<uint4*>(arena + op.dst);
      unsigned long long n = op.nblocks;
      unsigned grid = unsigned(std::min<uint64_t>((n + 255) / 256, 16384));
      module.launch(dequant, dim3(grid), dim3(256), 0, stg.stream, blocks, scales, out, n);
    }
    cuda_check(cudaEventRecord(stg.done[k], stg.stream), "cudaEventRecord");
    stg.used[k] = true;
    st.device_bytes += b.out_bytes;
    if (options.prefetch && i + 2 < batches.size())
      prefetch(batches[i + 2]);

    if (options.progress && seconds_since(t_report) >= options.progress_interval_s) {
      t_report = Clock::now();
      double s = seconds_since(t_stream);
      char line[128];
      std::snprintf(line, sizeof line, "[load] %.1f / %.1f GB, %.1f GB/s",
                    double(st.device_bytes) / 1e9, double(w.layout_.total_bytes) / 1e9,
                    s > 0 ? double(st.device_bytes) / 1e9 / s : 0.0);
      options.progress(line);
    }
  }
  t0 = Clock::now();
  cuda_check(cudaStreamSynchronize(stg.stream), "finishing the upload");
  st.wait_s += seconds_since(t0);
  st.transfer_s = seconds_since(t_stream);
  if (options.check_values && w.layout_.total_bytes > 0)
    check_finite(module, module.kernel("xserv_first_nonfinite"), stg.stream, specs, w.layout_,
                 arena);

  for (size_t i = 0; i < w.layout_.tensors.size(); ++i)
    w.index_.emplace(w.layout_.tensors[i].name, i);
  st.total_s = seconds_since(t_start);
  if (options.progress)
    options.progress(st.summary());
  return w;
}

} // namespace xserv::runtime
