// cuBLAS for the launch table's library calls (runtime::PlanLibraryCall): one handle bound to
// the stream of each call, its workspace allocated once, so that a call allocates nothing and
// may be captured into a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

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
  ///
  /// fixed_rows > 0 (the fixed order, PlanLibraryCall::fixed_rows): through cublasLt with one
  /// algorithm for the shape at every row count, the heuristic's pick for fixed_rows rows among
  /// those without split K (no reduction scheme) that fit the workspace, chosen at the shape's
  /// first call and kept:
  /// each output is then one chain over K whatever the step's rows (the natural K order of
  /// cuBLAS's kernels: docs/DESIGN.md, "The gemms' canonical order"). Throws when the library
  /// offers none, or the kept one refuses a row count.
  void gemm_bf16(cudaStream_t stream, int n, int k, int rows, bool accumulate, const void* x,
                 const void* w, void* y, int fixed_rows = 0) const;

  /// The fixed order's algorithm of a shape, as "algo A tile T stages S" (for logs and
  /// benchmarks); picks it as gemm_bf16 would.
  std::string fixed_algorithm(int n, int k, int fixed_rows) const;

private:
  struct Lt;
  void* handle_ = nullptr; ///< cublasHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  /// The fixed order's handle and kept algorithms, made at its first use.
  mutable std::unique_ptr<Lt> lt_;
  mutable std::once_flag lt_once_;
  Lt& lt() const;
};

} // namespace xserv::runtime
