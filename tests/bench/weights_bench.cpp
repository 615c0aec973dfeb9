// Benchmark (never a test): uploading a checkpoint to the GPU with DeviceWeights, several
// staging configurations, plus the ceilings that bound it (pinned host->device copy, dequant).
//
// weights_bench CKPT_DIR CACHE_DIR [THREADS:BUFFERS:MIB[:PREFETCH] ...] [--cold]
// The first upload counts from process start (CUDA context, kernel cache) to weights ready;
// --cold evicts the checkpoint's files from the page cache (posix_fadvise) before a last run.
#include "engine/weight_specs.h"
#include "models/checkpoint.h"
#include "runtime/module.h"
#include "runtime/nvrtc.h"
#include "runtime/weights.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fcntl.h>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

using namespace xserv;
using Clock = std::chrono::steady_clock;

namespace {

const Clock::time_point g_start = Clock::now();

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

/// Median of `reps` event-timed runs of `fn` on `s`, in seconds.
template <typename F> double time_median(cudaStream_t s, int reps, F fn) {
  cudaEvent_t a, b;
  ok(cudaEventCreate(&a), "event");
  ok(cudaEventCreate(&b), "event");
  std::vector<float> ms;
  for (int r = 0; r < reps + 2; ++r) {
    ok(cudaEventRecord(a, s), "record");
    fn();
    ok(cudaEventRecord(b, s), "record");
    ok(cudaEventSynchronize(b), "sync");
    float t = 0;
    ok(cudaEventElapsedTime(&t, a, b), "elapsed");
    if (r >= 2)
      ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] / 1e3;
}

/// Pinned host -> device copy bandwidth (GB/s), 1 GiB in 64 MiB copies, and the dequant
/// kernel's output bandwidth (GB/s of BF16 written) on 64 MiB of random blocks.
void ceilings() {
  cudaStream_t s;
  ok(cudaStreamCreate(&s), "stream");
  const size_t chunk = 64u << 20, total = 1u << 30;
  void *host, *dev;
  ok(cudaHostAlloc(&host, chunk, 0), "host alloc");
  ok(cudaMalloc(&dev, total * 4 + chunk), "malloc");
  std::mt19937 rng(1);
  for (size_t i = 0; i < chunk / 4; ++i)
    static_cast<uint32_t*>(host)[i] = rng();
  double h2d = time_median(s, 5, [&] {
    for (size_t off = 0; off < total; off += chunk)
      ok(cudaMemcpyAsync(static_cast<char*>(dev) + off, host, chunk, cudaMemcpyHostToDevice, s),
         "h2d");
  });
  std::printf("ceiling: pinned H2D %.1f GB/s (1 GiB in 64 MiB copies)\n", total / h2d / 1e9);

  runtime::CompileOptions o;
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  o.arch = "sm_" + std::to_string(major * 10 + minor);
  auto cubin = runtime::compile_cuda(runtime::mxfp4_dequant_source(), "dq", o).cubin;
  runtime::Module m = runtime::Module::load(cubin, "dq");
  runtime::Kernel k = m.kernel("xserv_mxfp4_to_bf16");
  // 64 MiB of blocks+scales as the upload stages them: n blocks, then n scale bytes.
  unsigned long long n = chunk / 17 / 256 * 256;
  ok(cudaMemcpy(dev, host, chunk, cudaMemcpyHostToDevice), "fill");
  auto* blocks = static_cast<const uint4*>(dev);
  auto* scales = static_cast<const unsigned char*>(dev) + n * 16;
  auto* out = reinterpret_cast<uint4*>(static_cast<char*>(dev) + chunk);
  unsigned grid = unsigned(std::min<unsigned long long>((n + 255) / 256, 16384));
  double kt =
      time_median(s, 20, [&] { m.launch(k, dim3(grid), dim3(256), 0, s, blocks, scales, out, n); });
  std::printf("ceiling: dequant kernel %.0f GB/s read+written (%.1f us per 64 MiB staged, %.0f "
              "GB/s of BF16 out)\n",
              n * (17 + 64) / kt / 1e9, kt * 1e6, n * 64 / kt / 1e9);
  cudaFreeHost(host);
  cudaFree(dev);
  cudaStreamDestroy(s);
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(
        stderr,
        "usage: weights_bench CKPT_DIR CACHE_DIR [THREADS:BUFFERS:MIB[:PREFETCH] ...] [--cold]\n");
    return 2;
  }
  std::vector<std::string> variants;
  bool cold = false;
  for (int i = 3; i < argc; ++i) {
    if (std::string(argv[i]) == "--cold")
      cold = true;
    else
      variants.push_back(argv[i]);
  }
  if (variants.empty())
    variants.push_back("0:4:32");
  try {
    auto ck = models::Checkpoint::open(argv[1]);
    std::vector<runtime::WeightSpec> specs = engine::weight_specs(ck);
    std::printf("%-14s %8s %8s %8s %8s %8s %8s %9s %9s\n", "threads:bufs:MiB", "total_s",
                "stream_s", "fill_s", "wait_s", "init_s", "kern_s", "read_GB/s", "gpu_GB/s");
    std::vector<std::string> rows;
    auto run = [&](const std::string& v, bool first) {
      runtime::UploadOptions o;
      int t = 0, b = 4, mib = 32, prefetch = 1;
      std::sscanf(v.c_str(), "%d:%d:%d:%d", &t, &b, &mib, &prefetch);
      o.prefetch = prefetch != 0;
      o.host_threads = t;
      o.staging_buffers = b;
      o.staging_bytes = uint64_t(mib) << 20;
      o.cache_dir = argv[2];
      o.progress = [](const std::string& l) { std::fprintf(stderr, "%s\n", l.c_str()); };
      runtime::DeviceWeights w = runtime::DeviceWeights::upload(specs, o);
      const auto& s = w.stats();
      if (first)
        std::printf("# process start -> weights ready: %.2f s (%.2f GB read, %.2f GB on GPU)\n",
                    since(g_start), s.bytes_read / 1e9, s.device_bytes / 1e9);
      char row[256];
      std::snprintf(row, sizeof row, "%-16s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %9.2f %9.2f",
                    v.c_str(), s.total_s, s.transfer_s, s.fill_s, s.wait_s, s.gpu_init_s,
                    s.kernel_s, s.bytes_read / 1e9 / s.transfer_s,
                    s.device_bytes / 1e9 / s.transfer_s);
      std::printf("%s\n", row);
      std::fflush(stdout);
    };
    for (size_t i = 0; i < variants.size(); ++i)
      run(variants[i], i == 0);
    if (cold) {
      for (const auto& f : ck.files()) {
        int fd = open(f.path().c_str(), O_RDONLY);
        if (fd >= 0) {
          posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
          close(fd);
        }
      }
      std::printf("# cold page cache (files evicted with posix_fadvise DONTNEED):\n");
      run(variants[0], false);
    }
    ceilings();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
