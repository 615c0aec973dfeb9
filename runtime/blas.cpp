// Blas over a dlopen'ed libcublas.so.13 (as NCCL is reached: binaries that never call a library
// gemm need no cuBLAS, and CPU-only machines none at all), and libcublasLt.so.13 for the fixed
// order's pinned algorithms.
#include "runtime/blas.h"

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
/// scale, w transposed) and the algorithm kept for each (n, k, fixed_rows).
struct Blas::Lt {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  std::mutex mu;
  std::map<std::tuple<int, int, int>, cublasLtMatmulAlgo_t> kept;

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

  /// The algorithm of (n, k) kept for fixed_rows: among the heuristic's picks at fixed_rows
  /// rows with no reduction scheme allowed, the first whose configuration says so (split K 1,
  /// reduction none) and that takes every row count a step can give it within the Blas's
  /// workspace (checked at 1, 8, 64, 65 and fixed_rows). Such an algorithm's sums are the
  /// natural chain over K at every row count, workspace or not (the 20b's lm_head picks one
  /// that asks for some: tests/codegen/blas_order_gpu_test.cpp, docs/PERF.md "Batch
  /// invariance").
  cublasLtMatmulAlgo_t algorithm(int n, int k, int fixed_rows, size_t workspace_bytes) {
    std::lock_guard<std::mutex> lock(mu);
    const auto key = std::make_tuple(n, k, fixed_rows);
    if (auto it = kept.find(key); it != kept.end())
      return it->second;
    const LtApi& a = lt_api();
    const std::string shape = fmt::format("a {} x {} -> {} gemm", fixed_rows, k, n);
    const LtLayouts l(n, k, fixed_rows);
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
    for (int i = 0; i < found; ++i) {
      int32_t splitk = 1;
      uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
      size_t w = 0;
      a.algo_get(&r[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &w);
      a.algo_get(&r[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme), &w);
      if (r[i].state != CUBLAS_STATUS_SUCCESS || r[i].workspaceSize > workspace_bytes ||
          splitk > 1 || scheme != CUBLASLT_REDUCTION_SCHEME_NONE ||
          !takes_every_step(r[i].algo, n, k, fixed_rows, workspace_bytes))
        continue;
      kept.emplace(key, r[i].algo);
      return r[i].algo;
    }
    throw Error(fmt::format("cuBLASLt offers no algorithm without split K that takes 1 to {} "
                            "rows for {} within its {} MiB workspace ({} candidates): a plan in "
                            "the natural order needs one",
                            fixed_rows, shape, workspace_bytes >> 20, found));
  }

  /// Whether `algo` takes the step sizes a plan's library call sees (it was picked for the
  /// largest) within `workspace_bytes`.
  bool takes_every_step(const cublasLtMatmulAlgo_t& algo, int n, int k, int fixed_rows,
                        size_t workspace_bytes) const {
    const LtApi& a = lt_api();
    for (int rows : {1, 8, 64, 65, fixed_rows}) {
      if (rows > fixed_rows)
        continue;
      const LtLayouts l(n, k, rows);
      cublasLtMatmulHeuristicResult_t check{};
      if (a.algo_check(handle, desc, l.w, l.x, l.y, l.y, &algo, &check) != CUBLAS_STATUS_SUCCESS ||
          check.workspaceSize > workspace_bytes)
        return false;
    }
    return true;
  }
};

Blas::Lt& Blas::lt() const {
  std::call_once(lt_once_, [this] { lt_ = std::make_unique<Lt>(); });
  return *lt_;
}

std::string Blas::fixed_algorithm(int n, int k, int fixed_rows) const {
  const cublasLtMatmulAlgo_t algo = lt().algorithm(n, k, fixed_rows, workspace_bytes_);
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
    const cublasLtMatmulAlgo_t algo = lt.algorithm(n, k, fixed_rows, workspace_bytes_);
    const LtLayouts l(n, k, rows);
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    const cublasStatus_t st =
        lt_api().matmul(lt.handle, lt.desc, &one, w, l.w, x, l.x, &beta, y, l.y, y, l.y, &algo,
                        workspace_, workspace_bytes_, stream);
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
