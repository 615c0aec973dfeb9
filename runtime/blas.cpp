// Blas over a dlopen'ed libcublas.so.13 (as NCCL is reached: binaries that never call a library
// gemm need no cuBLAS, and CPU-only machines none at all).
#include "runtime/blas.h"

#include <mutex>
#include <string>

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

void blas_ok(cublasStatus_t st, const std::string& what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw Error(fmt::format("cuBLAS: {}: {}", what, loaded().status_name(st)));
}

} // namespace

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
                     const void* w, void* y) const {
  if (rows <= 0)
    return;
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
