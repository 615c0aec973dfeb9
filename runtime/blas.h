// cuBLAS for the launch table's library calls (runtime::PlanLibraryCall): one handle bound to
// the stream of each call, its workspace allocated once, so that a call allocates nothing and
// may be captured into a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

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

  /// The fixed order's picks by step size: for each power of two of rows below fixed_rows, the
  /// fastest of the heuristic's picks for that many rows (no split K, no reduction scheme,
  /// within the workspace) whose sums equal the kept algorithm's bit for bit on random rows at
  /// both ends of its bucket, else the kept one; gemm_bf16 then calls a step of r rows with the
  /// pick of the bucket of the smallest power of two >= r. The kept algorithm's K order is the
  /// guarantee; the picks only reach it faster (kernels_bench "dense K order: cublasLt": the
  /// kept pick of 2,048 rows runs 1.5-2.7x slower at 1-512 rows than the per-count ones).
  /// x, w, y: the call's own operands ([fixed_rows, k] bf16 scratch that this overwrites with
  /// random rows, the weights, [fixed_rows, n] fp32 scratch), on the current device, outside
  /// any graph capture (it synchronises). Returns one line per bucket whose pick is not the
  /// kept one, with both timings.
  std::vector<std::string> tune_fixed(int n, int k, int fixed_rows, void* x, const void* w,
                                      void* y) const;

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
