// GPU tests of the module layer: NVRTC-compiled kernels loaded, launched and checked on the CPU.
#include "base/error.h"
#include "runtime/device.h"
#include "runtime/kernel_cache.h"
#include "runtime/module.h"
#include "runtime/nvrtc.h"
#include "tests/test_util.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace xserv::runtime;

/// Skips the rest of a test case, saying why, when no GPU is usable.
#define XSERV_REQUIRE_GPU(dev)                                                                     \
  const DeviceInfo dev = probe_device();                                                           \
  if (!dev.available) {                                                                            \
    MESSAGE("skipped: no GPU (" << dev.reason << ")");                                             \
    return;                                                                                        \
  }

namespace {

const char* kKernels = R"(// kernels: bf16_add, row_sum_f32
#include <cuda_bf16.h>

// c = bf16(float(a) + float(b)), rounded to nearest even.
extern "C" __global__ void bf16_add(const __nv_bfloat16* a, const __nv_bfloat16* b,
                                    __nv_bfloat16* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    c[i] = __float2bfloat16_rn(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

// out[row] = sum of x[row, :]; one block per row, the row staged in dynamic shared memory.
extern "C" __global__ void row_sum_f32(const float* x, float* out, int cols) {
  extern __shared__ float row[];
  const float* src = x + (long long)blockIdx.x * cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    row[c] = src[c];
  __syncthreads();
  float acc = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    acc += row[c];
  for (int off = 16; off > 0; off /= 2)
    acc += __shfl_down_sync(0xffffffffu, acc, off);
  __shared__ float warp_sums[32];
  if (threadIdx.x % 32 == 0)
    warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < (int)(blockDim.x / 32); ++w)
      total += warp_sums[w];
    out[blockIdx.x] = total;
  }
}
)";

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1); // round to nearest even (inputs here are finite)
  return uint16_t(u >> 16);
}

float from_bf16(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void cuda_ok(cudaError_t err, const char* what) {
  INFO(what << ": " << cudaGetErrorString(err));
  REQUIRE(err == cudaSuccess);
}

/// Device memory freed on scope exit.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { cuda_ok(cudaMalloc(&ptr, bytes), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(ptr); }
  template <typename T> T* as() const { return static_cast<T*>(ptr); }
};

std::string error_of(const auto& fn) {
  try {
    fn();
  } catch (const xserv::Error& e) {
    return e.what();
  }
  return "(no error)";
}

CompileOptions options_for(const DeviceInfo& dev) {
  CompileOptions opts;
  opts.arch = dev.arch();
  return opts;
}

} // namespace

TEST_CASE("gpu: a bf16 vector add compiled by NVRTC matches the CPU") {
  XSERV_REQUIRE_GPU(dev);
  xserv::testing::TempDir tmp("gpu_cache");
  const fs::path cache = tmp.path;
  CachedCubin cubin = get_or_compile(kKernels, "module_gpu_test", options_for(dev), cache);
  Module module = Module::load(cubin.cubin, "module_gpu_test");
  CHECK(module.kernel_names() == std::vector<std::string>{"bf16_add", "row_sum_f32"});
  Kernel add = module.kernel("bf16_add");
  CHECK(add.param_sizes == std::vector<size_t>{8, 8, 8, 4});

  const int n = 100003, pad = 64; // not a multiple of the block; a tail that must stay poisoned
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-8.0f, 8.0f);
  std::vector<uint16_t> a(n), b(n), c(n + pad);
  for (int i = 0; i < n; ++i) {
    a[i] = to_bf16(dist(rng));
    b[i] = to_bf16(dist(rng) * (i % 5 == 0 ? 1e-3f : 1.0f));
  }
  DeviceBuffer da(n * 2), db(n * 2), dc((n + pad) * 2);
  cuda_ok(cudaMemcpy(da.ptr, a.data(), n * 2, cudaMemcpyHostToDevice), "copy a");
  cuda_ok(cudaMemcpy(db.ptr, b.data(), n * 2, cudaMemcpyHostToDevice), "copy b");
  cuda_ok(cudaMemset(dc.ptr, 0xff, (n + pad) * 2), "poison c"); // 0xffff is a bf16 NaN

  Module moved = std::move(module); // the handle survives a move of its module
  CHECK_FALSE(module);
  moved.launch(add, dim3((n + 255) / 256), dim3(256), 0, nullptr, da.as<const void>(),
               db.as<const void>(), dc.as<void>(), n);
  cuda_ok(cudaDeviceSynchronize(), "bf16_add");
  cuda_ok(cudaMemcpy(c.data(), dc.ptr, (n + pad) * 2, cudaMemcpyDeviceToHost), "copy c");

  int wrong = 0, tail = 0;
  for (int i = 0; i < n; ++i)
    wrong += c[i] != to_bf16(from_bf16(a[i]) + from_bf16(b[i]));
  for (int i = n; i < n + pad; ++i)
    tail += c[i] != 0xffff;
  CHECK(wrong == 0);
  CHECK(tail == 0);
  MESSAGE(dev.name << " (" << dev.arch() << "): bf16_add of " << n
                   << " elements exact; compiled in " << cubin.compile_ms << " ms");
  fs::remove_all(cache);
}

TEST_CASE("gpu: a row reduction with 64 KiB of dynamic shared memory matches the CPU") {
  XSERV_REQUIRE_GPU(dev);
  Module module =
      Module::load(compile_cuda(kKernels, "module_gpu_test", options_for(dev)).cubin, "reduce");
  Kernel sum = module.kernel("row_sum_f32");
  CHECK(sum.static_smem == 32 * sizeof(float)); // warp_sums
  // 64 KiB per row: over the 48 KiB default limit; 48 KiB: at it, the static bytes past it.
  for (int cols : {16384, 12288}) {
    const int rows = 257;
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> x(size_t(rows) * cols), out(rows);
    for (float& v : x)
      v = dist(rng);
    DeviceBuffer dx(x.size() * 4), dout(rows * 4);
    cuda_ok(cudaMemcpy(dx.ptr, x.data(), x.size() * 4, cudaMemcpyHostToDevice), "copy x");
    cuda_ok(cudaMemset(dout.ptr, 0xff, rows * 4), "poison out");
    module.launch(sum, dim3(rows), dim3(512), cols * sizeof(float), nullptr, dx.as<const float>(),
                  dout.as<float>(), cols);
    cuda_ok(cudaDeviceSynchronize(), "row_sum_f32");
    cuda_ok(cudaMemcpy(out.data(), dout.ptr, rows * 4, cudaMemcpyDeviceToHost), "copy out");
    double worst = 0;
    for (int r = 0; r < rows; ++r) {
      double want = 0, scale = 0;
      for (int c = 0; c < cols; ++c) {
        want += x[size_t(r) * cols + c];
        scale += std::fabs(x[size_t(r) * cols + c]);
      }
      worst = std::max(worst, std::fabs(out[r] - want) / scale);
    }
    CHECK(worst < 1e-5);
    MESSAGE("row_sum_f32 " << rows << "x" << cols << ": worst error / sum|x| = " << worst);
  }
}

TEST_CASE("gpu: a cubin for another architecture is refused with a clear message") {
  XSERV_REQUIRE_GPU(dev);
  CompileOptions opts;
  opts.arch = dev.sm_major == 8 ? "sm_90" : "sm_80";
  auto cubin = compile_cuda(kKernels, "module_gpu_test", opts).cubin;
  std::string msg = error_of([&] { Module::load(cubin, "module_gpu_test"); });
  CHECK(msg.find("kernels were compiled for " + opts.arch + " but GPU 0 is " + dev.arch() +
                 ": recompile the plan") != std::string::npos);
  MESSAGE(msg);
}

TEST_CASE("gpu: unknown kernels and mismatched arguments are named in the error") {
  XSERV_REQUIRE_GPU(dev);
  Module module =
      Module::load(compile_cuda(kKernels, "module_gpu_test", options_for(dev)).cubin, "misuse");
  std::string missing = error_of([&] { module.kernel("bf16_mul"); });
  CHECK(missing.find("module misuse has no kernel 'bf16_mul'") != std::string::npos);
  CHECK(missing.find("bf16_add, row_sum_f32") != std::string::npos);

  Kernel add = module.kernel("bf16_add");
  void* p = nullptr;
  std::string few = error_of([&] { module.launch(add, dim3(1), dim3(32), 0, nullptr, p, p, p); });
  CHECK(few.find("takes 4 parameters (8, 8, 8, 4 bytes) but the launch passed 3") !=
        std::string::npos);
  std::string wide =
      error_of([&] { module.launch(add, dim3(1), dim3(32), 0, nullptr, p, p, p, size_t(1)); });
  CHECK(wide.find("passed 4 (8, 8, 8, 8 bytes)") != std::string::npos);

  std::string geometry =
      error_of([&] { module.launch(add, dim3(1), dim3(4096), 0, nullptr, p, p, p, 0); });
  CHECK(geometry.find("launching kernel 'bf16_add' of module misuse (grid 1x1x1, block "
                      "4096x1x1") != std::string::npos);
  MESSAGE(geometry);
  cuda_ok(cudaDeviceSynchronize(), "after the refused launches");
}
