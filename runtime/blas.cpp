// Blas over a dlopen'ed libcublas.so.13 (as NCCL is reached: binaries that never call a library
// gemm need no cuBLAS, and CPU-only machines none at all), and libcublasLt.so.13 for the fixed
// order's pinned algorithms.
#include "runtime/blas.h"

#include <cstring>
#include <initializer_list>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <fmt/format.h>

#include "base/error.h"
#include "runtime/dl_library.h"

namespace xserv::runtime {

namespace {

/// The cuBLAS entry points xserv uses, resolved once (cublas_v2.h maps the plain names to
/// these _v2 symbols).
struct Api {
  DlLibrary lib;
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;
  // cublasGemmEx has a C++ overload (cudaDataType compute type): the C signature spelled out.
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t) = nullptr;
  decltype(&cublasGetStatusName) status_name = nullptr;
};

const Api& api() {
  static Api a;
  static std::once_flag once;
  std::call_once(once, [] {
    a.lib = dl_open_cuda_library("libcublas.so.13", "cuBLAS for the plan's library gemms");
    if (!a.lib.handle)
      return;
    dl_resolve(a.lib, a.create, "cublasCreate_v2");
    dl_resolve(a.lib, a.destroy, "cublasDestroy_v2");
    dl_resolve(a.lib, a.set_stream, "cublasSetStream_v2");
    dl_resolve(a.lib, a.set_workspace, "cublasSetWorkspace_v2");
    dl_resolve(a.lib, a.gemm_ex, "cublasGemmEx");
    dl_resolve(a.lib, a.status_name, "cublasGetStatusName");
  });
  return a;
}

const Api& loaded() {
  return dl_loaded(api());
}

/// The cublasLt entry points of the fixed order.
struct LtApi {
  DlLibrary lib;
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmulAlgoConfigGetAttribute) algo_get = nullptr;
  decltype(&cublasLtMatmulAlgoCheck) algo_check = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
};

const LtApi& lt_api() {
  static LtApi a;
  static std::once_flag once;
  std::call_once(once, [] {
    a.lib = dl_open_cuda_library("libcublasLt.so.13", "cuBLASLt for the plan's fixed-order gemms");
    if (!a.lib.handle)
      return;
    dl_resolve(a.lib, a.create, "cublasLtCreate");
    dl_resolve(a.lib, a.destroy, "cublasLtDestroy");
    dl_resolve(a.lib, a.desc_create, "cublasLtMatmulDescCreate");
    dl_resolve(a.lib, a.desc_destroy, "cublasLtMatmulDescDestroy");
    dl_resolve(a.lib, a.desc_set, "cublasLtMatmulDescSetAttribute");
    dl_resolve(a.lib, a.layout_create, "cublasLtMatrixLayoutCreate");
    dl_resolve(a.lib, a.layout_destroy, "cublasLtMatrixLayoutDestroy");
    dl_resolve(a.lib, a.pref_create, "cublasLtMatmulPreferenceCreate");
    dl_resolve(a.lib, a.pref_destroy, "cublasLtMatmulPreferenceDestroy");
    dl_resolve(a.lib, a.pref_set, "cublasLtMatmulPreferenceSetAttribute");
    dl_resolve(a.lib, a.heuristic, "cublasLtMatmulAlgoGetHeuristic");
    dl_resolve(a.lib, a.algo_get, "cublasLtMatmulAlgoConfigGetAttribute");
    dl_resolve(a.lib, a.algo_check, "cublasLtMatmulAlgoCheck");
    dl_resolve(a.lib, a.matmul, "cublasLtMatmul");
  });
  return dl_loaded(a);
}

void lt_ok(cublasStatus_t st, const std::string& what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw Error(fmt::format("cuBLASLt: {}: status {}", what, int(st)));
}

/// The three matrices of y^T [n, rows] = op_T(w [k, n]) x^T [k, rows] (column-major, as
/// gemm_bf16 lays them out), destroyed with the scope.
struct LtLayouts {
  cublasLtMatrixLayout_t w = nullptr, x = nullptr, y = nullptr;
  LtLayouts(int n, int k, int rows) {
    const LtApi& a = lt_api();
    const cublasStatus_t sw = a.layout_create(&w, CUDA_R_16BF, uint64_t(k), uint64_t(n), k);
    const cublasStatus_t sx = a.layout_create(&x, CUDA_R_16BF, uint64_t(k), uint64_t(rows), k);
    const cublasStatus_t sy = a.layout_create(&y, CUDA_R_32F, uint64_t(n), uint64_t(rows), n);
    for (cublasStatus_t st : {sw, sx, sy})
      if (st != CUBLAS_STATUS_SUCCESS) {
        release();
        lt_ok(st, fmt::format("layouts of a {} x {} -> {} gemm", rows, k, n));
      }
  }
  ~LtLayouts() { release(); }
  void release() {
    const LtApi& a = lt_api();
    for (cublasLtMatrixLayout_t* l : {&w, &x, &y})
      if (*l) {
        a.layout_destroy(*l);
        *l = nullptr;
      }
  }
  LtLayouts(const LtLayouts&) = delete;
  LtLayouts& operator=(const LtLayouts&) = delete;
};

void blas_ok(cublasStatus_t st, const std::string& what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw Error(fmt::format("cuBLAS: {}: {}", what, loaded().status_name(st)));
}

} // namespace

/// The fixed order's state: a cublasLt handle, one matmul description (fp32 compute and
/// scale, w transposed) and the algorithms of each (n, k, fixed_rows): the kept one and the
/// verified picks by bucket of rows (Blas::tune_fixed).
struct Blas::Lt {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  struct Picks {
    cublasLtMatmulAlgo_t kept;
    std::map<int, cublasLtMatmulAlgo_t> buckets; ///< by power of two of rows below fixed_rows
  };
  std::mutex mu;
  std::map<std::tuple<int, int, int>, Picks> shapes;

  Lt() {
    const LtApi& a = lt_api();
    lt_ok(a.create(&handle), "creating a handle");
    lt_ok(a.desc_create(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "a matmul description");
    const cublasOperation_t t = CUBLAS_OP_T;
    lt_ok(a.desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)), "op T for the weights");
  }
  ~Lt() {
    const LtApi& a = lt_api();
    if (desc)
      a.desc_destroy(desc);
    if (handle)
      a.destroy(handle);
  }

  /// The kept algorithm of (n, k, fixed_rows), picked at its first use.
  cublasLtMatmulAlgo_t algorithm(int n, int k, int fixed_rows, size_t workspace_bytes) {
    std::lock_guard<std::mutex> lock(mu);
    return picks(n, k, fixed_rows, workspace_bytes).kept;
  }

  /// The algorithm a step of `rows` rows takes: its bucket's verified pick, else the kept one.
  cublasLtMatmulAlgo_t algorithm_for(int n, int k, int fixed_rows, int rows,
                                     size_t workspace_bytes) {
    std::lock_guard<std::mutex> lock(mu);
    const Picks& p = picks(n, k, fixed_rows, workspace_bytes);
    if (const auto it = p.buckets.find(bucket_of(rows, fixed_rows)); it != p.buckets.end())
      return it->second;
    return p.kept;
  }

  void set_buckets(int n, int k, int fixed_rows, std::map<int, cublasLtMatmulAlgo_t> buckets) {
    std::lock_guard<std::mutex> lock(mu);
    shapes.at(std::make_tuple(n, k, fixed_rows)).buckets = std::move(buckets);
  }

  /// The smallest power of two >= rows, or fixed_rows from there on (the kept algorithm's).
  static int bucket_of(int rows, int fixed_rows) {
    int b = 1;
    while (b < rows)
      b *= 2;
    return b >= fixed_rows ? fixed_rows : b;
  }

  /// The heuristic's picks for `rows` rows of (n, k) with no reduction scheme allowed whose
  /// configuration says so (split K 1, reduction none) within `workspace_bytes`, best first.
  std::vector<cublasLtMatmulAlgo_t> candidates(int n, int k, int rows, size_t workspace_bytes,
                                               int* offered = nullptr) const {
    const LtApi& a = lt_api();
    const std::string shape = fmt::format("a {} x {} -> {} gemm", rows, k, n);
    const LtLayouts l(n, k, rows);
    cublasLtMatmulPreference_t pref = nullptr;
    lt_ok(a.pref_create(&pref), "a preference");
    const uint64_t bytes = workspace_bytes;
    const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
    cublasStatus_t st =
        a.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof(bytes));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = a.pref_set(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &none, sizeof(none));
    constexpr int kAsk = 8;
    cublasLtMatmulHeuristicResult_t r[kAsk] = {};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
      st = a.heuristic(handle, desc, l.w, l.x, l.y, l.y, pref, kAsk, r, &found);
    a.pref_destroy(pref);
    lt_ok(st, "the heuristic's algorithms for " + shape);
    if (offered)
      *offered = found;
    std::vector<cublasLtMatmulAlgo_t> out;
    for (int i = 0; i < found; ++i) {
      int32_t splitk = 1;
      uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
      size_t w = 0;
      a.algo_get(&r[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &w);
      a.algo_get(&r[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme), &w);
      if (r[i].state == CUBLAS_STATUS_SUCCESS && r[i].workspaceSize <= workspace_bytes &&
          splitk <= 1 && scheme == CUBLASLT_REDUCTION_SCHEME_NONE)
        out.push_back(r[i].algo);
    }
    return out;
  }

  /// Whether `algo` takes each of `rows` within `workspace_bytes`.
  bool takes(const cublasLtMatmulAlgo_t& algo, int n, int k, std::initializer_list<int> rows,
             size_t workspace_bytes) const {
    const LtApi& a = lt_api();
    for (int r : rows) {
      const LtLayouts l(n, k, r);
      cublasLtMatmulHeuristicResult_t check{};
      if (a.algo_check(handle, desc, l.w, l.x, l.y, l.y, &algo, &check) != CUBLAS_STATUS_SUCCESS ||
          check.workspaceSize > workspace_bytes)
        return false;
    }
    return true;
  }

private:
  /// The shape's picks, the kept algorithm chosen at its first call (mu held): among the
  /// heuristic's picks at fixed_rows rows (candidates), the first that takes every row count a
  /// step can give it within the Blas's workspace (checked at 1, 8, 64, 65 and fixed_rows).
  /// Such an algorithm's sums are the natural chain over K at every row count, workspace or
  /// not (the 20b's lm_head picks one that asks for some: tests/codegen/blas_order_gpu_test.cpp,
  /// docs/PERF.md "Batch invariance").
  Picks& picks(int n, int k, int fixed_rows, size_t workspace_bytes) {
    const auto key = std::make_tuple(n, k, fixed_rows);
    if (auto it = shapes.find(key); it != shapes.end())
      return it->second;
    int offered = 0;
    for (const cublasLtMatmulAlgo_t& algo : candidates(n, k, fixed_rows, workspace_bytes, &offered))
      if (takes(algo, n, k,
                {1, std::min(8, fixed_rows), std::min(64, fixed_rows), std::min(65, fixed_rows),
                 fixed_rows},
                workspace_bytes))
        return shapes.emplace(key, Picks{algo, {}}).first->second;
    throw Error(fmt::format("cuBLASLt offers no algorithm without split K that takes 1 to {} "
                            "rows for a {} x {} -> {} gemm within its {} MiB workspace ({} "
                            "candidates): a plan in the natural order needs one",
                            fixed_rows, fixed_rows, k, n, workspace_bytes >> 20, offered));
  }
};

Blas::Lt& Blas::lt() const {
  std::call_once(lt_once_, [this] { lt_ = std::make_unique<Lt>(); });
  return *lt_;
}

namespace {

/// An algorithm as "algo A tile T stages S split K 1 reduction 0".
std::string describe(const cublasLtMatmulAlgo_t& algo) {
  const LtApi& a = lt_api();
  int32_t id = -1, splitk = -1, stages = -1;
  uint32_t tile = 0, scheme = 0;
  size_t w = 0;
  a.algo_get(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &w);
  a.algo_get(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &w);
  a.algo_get(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &w);
  a.algo_get(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &w);
  a.algo_get(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme), &w);
  return fmt::format("algo {} tile {} stages {} split K {} reduction {}", id, tile, stages, splitk,
                     scheme);
}

void cuda_ok(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess)
    throw Error(fmt::format("cuBLASLt's fixed-order picks: {}: {}", what, cudaGetErrorString(e)));
}

} // namespace

std::string Blas::fixed_algorithm(int n, int k, int fixed_rows) const {
  return describe(lt().algorithm(n, k, fixed_rows, workspace_bytes_));
}

std::vector<std::string> Blas::tune_fixed(int n, int k, int fixed_rows, void* x, const void* w,
                                          void* y) const {
  Lt& lt = this->lt();
  const cublasLtMatmulAlgo_t kept = lt.algorithm(n, k, fixed_rows, workspace_bytes_);
  // Random bf16 rows (magnitudes 2^-7 .. 2, either sign): a different K order changes most
  // sums' last bits on them (kernels_bench "dense K order").
  std::vector<uint16_t> hx(size_t(fixed_rows) * size_t(k));
  uint64_t s = 0x9e3779b97f4a7c15ull ^ (uint64_t(uint32_t(n)) << 32 | uint32_t(k));
  for (uint16_t& v : hx) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    v = uint16_t((s >> 63) << 15 | (120 + (s >> 8) % 8) << 7 | (s & 0x7f));
  }
  cuda_ok(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice), "staging rows");
  const LtApi& a = lt_api();
  const float one = 1.0f, zero = 0.0f;
  auto run = [&](const cublasLtMatmulAlgo_t& algo, int rows) {
    const LtLayouts l(n, k, rows);
    return a.matmul(lt.handle, lt.desc, &one, w, l.w, x, l.x, &zero, y, l.y, y, l.y, &algo,
                    workspace_, workspace_bytes_, nullptr) == CUBLAS_STATUS_SUCCESS;
  };
  auto fetch = [&](int rows) {
    std::vector<float> out(size_t(rows) * size_t(n));
    cuda_ok(cudaMemcpy(out.data(), y, out.size() * sizeof(float), cudaMemcpyDeviceToHost),
            "reading sums");
    return out;
  };
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  cuda_ok(cudaEventCreate(&e0), "an event");
  if (const cudaError_t e = cudaEventCreate(&e1); e != cudaSuccess) {
    cudaEventDestroy(e0);
    cuda_ok(e, "an event");
  }
  auto time_us = [&](const cublasLtMatmulAlgo_t& algo, int rows) {
    constexpr int kRuns = 5;
    run(algo, rows);
    cudaEventRecord(e0, nullptr);
    for (int i = 0; i < kRuns; ++i)
      run(algo, rows);
    cudaEventRecord(e1, nullptr);
    float ms = 0;
    cuda_ok(cudaEventSynchronize(e1), "timing");
    cudaEventElapsedTime(&ms, e0, e1);
    return double(ms) * 1e3 / kRuns;
  };
  std::map<int, cublasLtMatmulAlgo_t> buckets;
  std::vector<std::string> lines;
  try {
    for (int b = 1; b < fixed_rows; b *= 2) {
      const int lo = b / 2 + 1;
      if (!run(kept, b))
        throw Error(fmt::format("cuBLASLt: the kept algorithm of a {} x {} -> {} gemm failed at "
                                "{} rows",
                                fixed_rows, k, n, b));
      const std::vector<float> ref = fetch(b);
      const double t_kept = time_us(kept, b);
      double t_best = t_kept;
      const cublasLtMatmulAlgo_t* best = nullptr;
      const std::vector<cublasLtMatmulAlgo_t> cands = lt.candidates(n, k, b, workspace_bytes_);
      for (const cublasLtMatmulAlgo_t& c : cands) {
        if (std::memcmp(&c, &kept, sizeof(c)) == 0 || !lt.takes(c, n, k, {lo, b}, workspace_bytes_))
          continue;
        // The same bits as the kept algorithm at both ends of the bucket, or not at all.
        if (!run(c, b) || std::memcmp(fetch(b).data(), ref.data(), ref.size() * 4) != 0 ||
            !run(c, lo) || std::memcmp(fetch(lo).data(), ref.data(), size_t(lo) * n * 4) != 0)
          continue;
        if (const double t = time_us(c, b); t < t_best) {
          t_best = t;
          best = &c;
        }
      }
      if (best && t_best < 0.95 * t_kept) { // a clear gain, not the timing's noise
        buckets.emplace(b, *best);
        lines.push_back(fmt::format("{} x {} -> {} at {} to {} rows: {}, {:.1f} us at {} rows "
                                    "against the kept algorithm's {:.1f} (the same bits)",
                                    fixed_rows, k, n, lo, b, describe(*best), t_best, b, t_kept));
      }
    }
  } catch (...) {
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    throw;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cuda_ok(cudaGetLastError(), "the picks' gemms");
  lt.set_buckets(n, k, fixed_rows, std::move(buckets));
  return lines;
}

Blas::Blas(size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  const Api& a = loaded();
  cublasHandle_t h = nullptr;
  blas_ok(a.create(&h), "creating a handle");
  handle_ = h;
  if (cudaMalloc(&workspace_, workspace_bytes_) != cudaSuccess) {
    a.destroy(h);
    handle_ = nullptr;
    workspace_ = nullptr;
    throw Error(fmt::format("cuBLAS: cannot allocate its {} MiB workspace on the GPU",
                            workspace_bytes_ >> 20));
  }
}

Blas::~Blas() {
  if (handle_)
    api().destroy(static_cast<cublasHandle_t>(handle_));
  if (workspace_)
    cudaFree(workspace_);
}

void Blas::gemm_bf16(cudaStream_t stream, int n, int k, int rows, bool accumulate, const void* x,
                     const void* w, void* y, int fixed_rows) const {
  if (rows <= 0)
    return;
  if (fixed_rows > 0) {
    Lt& lt = this->lt();
    const cublasLtMatmulAlgo_t algo = lt.algorithm_for(n, k, fixed_rows, rows, workspace_bytes_);
    const LtLayouts l(n, k, rows);
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    cublasStatus_t st =
        lt_api().matmul(lt.handle, lt.desc, &one, w, l.w, x, l.x, &beta, y, l.y, y, l.y, &algo,
                        workspace_, workspace_bytes_, stream);
    // A bucket's pick was checked at its bucket's ends: a row count between that it refuses
    // (before launching anything) takes the kept algorithm, whose sums are the same.
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
      const cublasLtMatmulAlgo_t kept = lt.algorithm(n, k, fixed_rows, workspace_bytes_);
      if (std::memcmp(&kept, &algo, sizeof(algo)) != 0)
        st = lt_api().matmul(lt.handle, lt.desc, &one, w, l.w, x, l.x, &beta, y, l.y, y, l.y,
                             &kept, workspace_, workspace_bytes_, stream);
    }
    if (st != CUBLAS_STATUS_SUCCESS)
      throw Error(fmt::format("cuBLASLt: the fixed-order gemm of {} rows x {} -> {} (its algorithm "
                              "kept from {} rows) failed with status {}",
                              rows, k, n, fixed_rows, int(st)));
    return;
  }
  const Api& a = loaded();
  auto h = static_cast<cublasHandle_t>(handle_);
  const auto what = [&] { return fmt::format("gemm of {} rows x {} -> {}", rows, k, n); };
  if (cublasStatus_t st = a.set_stream(h, stream); st != CUBLAS_STATUS_SUCCESS)
    blas_ok(st, what());
  if (cublasStatus_t st = a.set_workspace(h, workspace_, workspace_bytes_);
      st != CUBLAS_STATUS_SUCCESS)
    blas_ok(st, what());
  // Row-major y = x w^T is column-major y^T [n, rows] = w [n, k] (stored k x n: op T) times
  // x^T [k, rows] (stored as it is: op N).
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  if (cublasStatus_t st = a.gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, &one, w, CUDA_R_16BF,
                                    k, x, CUDA_R_16BF, k, &beta, y, CUDA_R_32F, n,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      st != CUBLAS_STATUS_SUCCESS)
    blas_ok(st, what());
}

} // namespace xserv::runtime
