// Helpers of the GPU kernel tests: random inputs, device buffers, compiling and launching one
// generated kernel, relative L2 error.
#pragma once

#include "codegen/emit.h"
#include "ir/tensor.h"
#include "models/bf16.h"
#include "runtime/device.h"
#include "runtime/module.h"
#include "runtime/nvrtc.h"
#include "tests/test_util.h"

#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

/// Skips the rest of a test case, saying why, when no GPU is usable.
#define XSERV_REQUIRE_GPU()                                                                        \
  if (const runtime::DeviceInfo dev = runtime::probe_device(); !dev.available) {                   \
    MESSAGE("skipped: no GPU (" << dev.reason << ")");                                             \
    return;                                                                                        \
  }

namespace xserv::kernel_test {

using codegen::kernel_headers;
using codegen::KernelSource;
using ir::DType;
using ir::Tensor;

inline void cuda_ok(cudaError_t err, const char* what) {
  INFO(what << ": " << cudaGetErrorString(err));
  REQUIRE(err == cudaSuccess);
}

/// splitmix64-driven uniform floats in [-scale, scale).
struct Rng {
  uint64_t s;
  float next(float scale) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return scale * (float(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
};

inline Tensor random_f32(Rng& rng, std::vector<int64_t> shape, float scale) {
  Tensor t = Tensor::zeros(DType::F32, std::move(shape));
  for (float& v : t.f)
    v = rng.next(scale);
  return t;
}

/// A random bf16 weight: `f` holds the bf16 values as fp32 (what ref sees), `bits` the upload.
struct Bf16Weight {
  Tensor t;
  std::vector<uint16_t> bits;
};

inline Bf16Weight random_bf16(Rng& rng, std::vector<int64_t> shape, float scale) {
  Bf16Weight w{random_f32(rng, std::move(shape), scale), {}};
  w.bits.resize(w.t.f.size());
  for (size_t i = 0; i < w.t.f.size(); ++i) {
    w.bits[i] = models::float_to_bf16(w.t.f[i]);
    w.t.f[i] = models::bf16_to_float(w.bits[i]);
  }
  return w;
}

/// A device buffer freed on destruction.
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t n) : bytes(n) {
    cuda_ok(cudaMalloc(&p, std::max<size_t>(n, 4)), "malloc");
  }
  DevBuf(const DevBuf&) = delete;
  ~DevBuf() { cudaFree(p); }
};

template <typename T> std::unique_ptr<DevBuf> upload(const std::vector<T>& v) {
  auto b = std::make_unique<DevBuf>(v.size() * sizeof(T));
  cuda_ok(cudaMemcpy(b->p, v.data(), b->bytes, cudaMemcpyHostToDevice), "upload");
  return b;
}
inline std::unique_ptr<DevBuf> upload(const Tensor& t) {
  return t.is_int() ? upload(t.i) : upload(t.f);
}

/// An fp32 output buffer filled with NaN so unwritten elements fail the comparison.
inline std::unique_ptr<DevBuf> poisoned(size_t n) {
  return upload(std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()));
}

inline std::vector<float> download(const DevBuf& b, size_t n) {
  std::vector<float> v(n);
  cuda_ok(cudaMemcpy(v.data(), b.p, n * sizeof(float), cudaMemcpyDeviceToHost), "download");
  return v;
}

inline std::vector<int32_t> download_ints(const DevBuf& b, size_t n) {
  std::vector<int32_t> v(n);
  cuda_ok(cudaMemcpy(v.data(), b.p, n * sizeof(int32_t), cudaMemcpyDeviceToHost), "download");
  return v;
}

using xserv::testing::rel_l2; // tests/test_util.h

/// A compiled and loaded kernel with its launch rule.
struct Loaded {
  KernelSource src;
  runtime::Module module;
  runtime::Kernel kernel;
};

/// The kernels loaded so far in this process, by name.
inline std::map<std::string, std::unique_ptr<Loaded>>& loaded_kernels() {
  static std::map<std::string, std::unique_ptr<Loaded>> loaded;
  return loaded;
}

inline runtime::CompileOptions compile_options() {
  runtime::CompileOptions opts;
  opts.arch = runtime::probe_device().arch();
  opts.headers = kernel_headers();
  return opts;
}

/// Compiles and loads `src`, once per kernel name in the process (tests reuse shapes).
inline const Loaded& load(KernelSource src) {
  auto& slot = loaded_kernels()[src.name];
  if (!slot) {
    const runtime::CompileResult r = runtime::compile_cuda(src.source, src.name, compile_options());
    runtime::Module m = runtime::Module::load(r.cubin, src.name);
    runtime::Kernel k = m.kernel(src.name);
    slot = std::make_unique<Loaded>(Loaded{std::move(src), std::move(m), std::move(k)});
  }
  return *slot;
}

/// Compiles the kernels of `srcs` not loaded yet on all cores at once (NVRTC is thread-safe) and
/// loads them, so that a benchmark of many variants does not compile one after the other.
inline void preload(std::vector<KernelSource> srcs) {
  std::map<std::string, KernelSource> todo;
  for (KernelSource& s : srcs)
    if (!loaded_kernels().count(s.name))
      todo.emplace(s.name, std::move(s));
  const runtime::CompileOptions opts = compile_options();
  const size_t width = std::max(1u, std::thread::hardware_concurrency());
  auto it = todo.begin();
  while (it != todo.end()) { // batches of one compile per core
    std::vector<std::pair<KernelSource, std::future<runtime::CompileResult>>> jobs;
    for (; it != todo.end() && jobs.size() < width; ++it) {
      const std::string source = it->second.source, kname = it->second.name;
      jobs.emplace_back(std::move(it->second),
                        std::async(std::launch::async, [source, kname, opts] {
                          return runtime::compile_cuda(source, kname, opts);
                        }));
    }
    for (auto& [s, f] : jobs) {
      const runtime::CompileResult r = f.get();
      runtime::Module m = runtime::Module::load(r.cubin, s.name);
      runtime::Kernel k = m.kernel(s.name);
      const std::string name = s.name;
      loaded_kernels()[name] =
          std::make_unique<Loaded>(Loaded{std::move(s), std::move(m), std::move(k)});
    }
  }
}

template <typename... Args> void launch(const Loaded& l, int tokens, int splits, Args... args) {
  const auto g = l.src.launch.grid(tokens, splits);
  l.module.launch(l.kernel, dim3(g[0], g[1], g[2]), dim3(l.src.launch.block),
                  l.src.launch.smem(tokens), nullptr, args...);
}

inline void device_sync() {
  cuda_ok(cudaDeviceSynchronize(), "kernel");
}

/// The random weights of an MoE block, uploaded.
struct MoeWeights {
  Bf16Weight gate_up, gate_up_b, down, down_b;
  std::unique_ptr<DevBuf> d_gate_up, d_gate_up_b, d_down, d_down_b;
  MoeWeights(Rng& rng, const codegen::MoeDims& d)
      : gate_up(random_bf16(rng, {d.experts, 2 * d.inter, d.hidden},
                            4.0f / std::sqrt(float(d.hidden)))),
        gate_up_b(random_bf16(rng, {d.experts, 2 * d.inter}, 0.5f)),
        down(random_bf16(rng, {d.experts, d.hidden, d.inter}, 1.0f / std::sqrt(float(d.inter)))),
        down_b(random_bf16(rng, {d.experts, d.hidden}, 0.5f)), d_gate_up(upload(gate_up.bits)),
        d_gate_up_b(upload(gate_up_b.bits)), d_down(upload(down.bits)),
        d_down_b(upload(down_b.bits)) {}
};

/// Median kernel time in ms of `run(i)` over 20 runs after 3 warm-ups, by CUDA events.
template <typename F> double median_ms(F&& run) {
  cudaEvent_t a, b;
  cuda_ok(cudaEventCreate(&a), "event");
  cuda_ok(cudaEventCreate(&b), "event");
  for (int i = 0; i < 3; ++i)
    run(i);
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    cudaEventRecord(a);
    run(i);
    cudaEventRecord(b);
    cuda_ok(cudaEventSynchronize(b), "timing");
    float m = 0;
    cudaEventElapsedTime(&m, a, b);
    ms.push_back(m);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

/// Average us per launch of `run(i)` over 40 back-to-back launches (after 5 warm-ups), by CUDA
/// events around the whole run: launch gaps amortised, as in a CUDA graph without PDL.
template <typename F> double back_to_back_us(F&& run) {
  for (int i = 0; i < 5; ++i)
    run(i);
  cudaEvent_t a, b;
  cuda_ok(cudaEventCreate(&a), "event");
  cuda_ok(cudaEventCreate(&b), "event");
  std::vector<float> per;
  for (int rep = 0; rep < 5; ++rep) {
    cudaEventRecord(a);
    for (int i = 0; i < 40; ++i)
      run(i);
    cudaEventRecord(b);
    cuda_ok(cudaEventSynchronize(b), "timing");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    per.push_back(ms * 1e3f / 40);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(per.begin(), per.end());
  return per[per.size() / 2];
}

/// Block tables of a paged KV cache for a test: each sequence's blocks are distinct random blocks
/// of a pool larger than they need (so no two sequences' blocks are adjacent or in order), the
/// first `shared` of every sequence's blocks the same as sequence 0's (a shared prefix), and with
/// a window only the blocks that hold positions a query can see: the others are the null block
/// 0, which no real block of a sequence is (as the engine's tables).
struct PagedTables {
  int block = 16, table = 0; ///< positions per block, entries per table row
  int blocks = 0;            ///< of the pool
  std::vector<int32_t> rows; ///< [sequences, table]
  Tensor tensor() const {
    return Tensor::from_ints({int64_t(rows.size() / size_t(table)), table}, rows);
  }
};

/// Tables for sequences that hold positions [lo[b], hi[b]) (a query sees nothing below lo).
inline PagedTables random_tables(uint64_t seed, int block, int table, const std::vector<int>& lo,
                                 const std::vector<int>& hi, int shared = 0) {
  PagedTables t;
  t.block = block;
  t.table = table;
  int need = 0;
  for (size_t b = 0; b < lo.size(); ++b)
    need += (hi[b] + block - 1) / block;
  t.blocks = 2 * need + 3;
  std::vector<int32_t> free(size_t(t.blocks - 1)); // block 0 is the null block
  for (int i = 1; i < t.blocks; ++i)
    free[size_t(i - 1)] = i;
  uint64_t z = seed;
  for (size_t i = free.size(); i > 1; --i) { // a seeded shuffle
    z = z * 6364136223846793005ull + 1442695040888963407ull;
    std::swap(free[i - 1], free[size_t(z >> 33) % i]);
  }
  t.rows.assign(lo.size() * size_t(table), 0);
  size_t next = 0;
  for (size_t b = 0; b < lo.size(); ++b)
    for (int i = lo[b] / block; i * block < hi[b]; ++i) {
      REQUIRE(i < table);
      t.rows[b * size_t(table) + size_t(i)] =
          b > 0 && i < shared && t.rows[size_t(i)] > 0 ? t.rows[size_t(i)] : free[next++];
    }
  return t;
}

/// x rounded to the nearest fp16 value (ties to even), saturating at +-65504 as the attention
/// kernels' cvt.rn.satfinite does.
inline float round_f16(float x) {
  if (!std::isfinite(x))
    return x;
  const float a = std::fabs(x);
  if (a >= 65504.0f)
    return std::copysign(65504.0f, x);
  int e = 0;
  std::frexp(a, &e); // a = m 2^e, m in [0.5, 1): 11 significant bits keep quanta of 2^(e-11)
  const int q = std::max(e - 11, -24); // subnormal fp16 below 2^-14: quanta of 2^-24
  return std::ldexp(std::nearbyint(std::ldexp(x, -q)), q);
}

/// t with every value v as round_f16(v * pre) / pre (q is rounded after its scale).
inline Tensor rounded_f16(const Tensor& t, float pre = 1.0f) {
  Tensor r = t;
  for (float& x : r.f)
    x = round_f16(x * pre) / pre;
  return r;
}

} // namespace xserv::kernel_test
