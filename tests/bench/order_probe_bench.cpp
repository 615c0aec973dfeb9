// What the dense linears' canonical order can rest on (issue: batch invariance by default):
// which orders of a dot product's tensor-core sums give the same fp32 bits. Part of kernels_bench
// (never run by ctest; the findings go to docs/DESIGN.md and the issue):
//   build/tests/kernels_bench -tc="dense K order*"
// 1. Inside one MMA: a chain of mma.sync m16n8k16 over K in natural order against the same
//    chain with each instruction's 16 products in other positions (reversed), and against
//    gemm_wg's slot grouping (other K values share an instruction).
// 2. cuBLAS (runtime::Blas, the plans' library call) at 1 to 2,048 rows: against the natural
//    chain, and against its own rows at 2,048 (is it invariant in the rows it is given?).
#include "runtime/blas.h"
#include "tests/codegen/kernel_test_util.h"
#include "tests/codegen/order_chain.h"

#include <string>
#include <vector>

using namespace xserv;
using namespace xserv::codegen;
using namespace xserv::kernel_test;

TEST_CASE("dense K order: positions inside an MMA, gemm_wg's grouping, cuBLAS (informational)") {
  XSERV_REQUIRE_GPU();
  struct Shape {
    const char* name;
    int k, n;
  };
  const Shape shapes[] = {{"20b qkv", 2880, 5120}, {"20b o_proj", 4096, 2880}};
  const int kMaxT = 2048;
  for (const Shape& s : shapes) {
    Rng rng{4242};
    // Weights and activations as the model has them: bf16, spread exponents (RMS ~1 / sqrt(K)
    // weights, activations ~1).
    auto x = upload(random_bf16(rng, {kMaxT, s.k}, 1.0f).bits);
    auto w = upload(random_bf16(rng, {s.n, s.k}, 1.0f / std::sqrt(float(s.k))).bits);
    const std::vector<float> natural = run_chain(*x, *w, kMaxT, s.n, s.k, 0);
    const std::vector<float> reversed = run_chain(*x, *w, kMaxT, s.n, s.k, 1);
    const std::vector<float> slots = run_chain(*x, *w, kMaxT, s.n, s.k, 2);
    const size_t all = natural.size();
    MESSAGE(s.name << ": of " << all << " sums, natural order against each instruction's "
                   << "products reversed: " << differing(natural, reversed, all)
                   << " differ; against gemm_wg's slot grouping: "
                   << differing(natural, slots, all));
    runtime::Blas blas;
    std::vector<float> full;
    for (int t : {2048, 1, 8, 64, 65, 128, 256, 512, 1000}) {
      auto y = poisoned(size_t(t) * s.n);
      blas.gemm_bf16(nullptr, s.n, s.k, t, false, x->p, w->p, y->p);
      device_sync();
      const std::vector<float> got = download(*y, size_t(t) * s.n);
      if (t == kMaxT)
        full = got;
      const size_t count = got.size();
      MESSAGE(s.name << " cuBLAS at " << t << " rows: against the natural chain "
                     << differing(got, natural, count) << ", against gemm_wg's slots "
                     << differing(got, slots, count) << ", against its own rows at 2048 "
                     << differing(got, full, count) << " of " << count << " differ");
    }
  }
}
