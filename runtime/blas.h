// cuBLAS for the launch table's library calls (runtime::PlanLibraryCall): one handle bound to
// the stream of each call, its workspace allocated once, so that a call allocates nothing and
// may be captured into a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace xserv::runtime {

class Blas {
public:
  /// Creates the handle and a workspace of `workspace_bytes` on the current device. Throws
  /// xserv::Error when cuBLAS cannot start.
  explicit Blas(size_t workspace_bytes = size_t{32} << 20);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  /// PlanLibraryCall::Op::GemmBf16 on `stream`: y[rows, n] = x[rows, k] w[n, k]^T (+ y when
  /// accumulate); x and w bf16, row-major; y fp32; fp32 accumulation. Throws xserv::Error naming
  /// the shape on a cuBLAS error.
  void gemm_bf16(cudaStream_t stream, int n, int k, int rows, bool accumulate, const void* x,
                 const void* w, void* y) const;

private:
  void* handle_ = nullptr; ///< cublasHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

} // namespace xserv::runtime
