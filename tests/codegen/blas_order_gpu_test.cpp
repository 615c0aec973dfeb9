// runtime::Blas's fixed order (PlanLibraryCall::fixed_rows: plans in the natural K order) against
// the natural chain on mma.sync (order_chain.h), bit for bit, at every row count a step can have:
// the shapes of the 20b's projections, router and lm_head, the algorithm kept from the largest,
// then each size bucket's faster pick (Blas::tune_fixed).
#include "runtime/blas.h"
#include "tests/codegen/kernel_test_util.h"
#include "tests/codegen/order_chain.h"

#include <cmath>

using namespace xserv;
using namespace xserv::kernel_test;

TEST_CASE("Blas's fixed order is the natural chain over K at every row count") {
  XSERV_REQUIRE_GPU();
  struct Shape {
    int k, n, max_t;
  };
  // qkv, o_proj, the router, lm_head (its rows are sequences: up to 256).
  for (const Shape& s : {Shape{2880, 5120, 2048}, Shape{4096, 2880, 2048}, Shape{2880, 32, 2048},
                         Shape{2880, 201088, 256}}) {
    CAPTURE(s.k);
    CAPTURE(s.n);
    Rng rng{uint64_t(4400 + s.n)};
    auto x = upload(random_bf16(rng, {s.max_t, s.k}, 1.0f).bits);
    auto w = upload(random_bf16(rng, {s.n, s.k}, 1.0f / std::sqrt(float(s.k))).bits);
    const std::vector<float> natural = run_chain(*x, *w, s.max_t, s.n, s.k, 0);
    runtime::Blas blas;
    MESSAGE(s.k << " -> " << s.n << ": " << blas.fixed_algorithm(s.n, s.k, s.max_t));
    auto check_rows = [&] {
      for (int t : {1, 2, 3, 8, 9, 16, 33, 64, 65, 100, 128, 129, 256, 512, 1000, 2048}) {
        if (t > s.max_t)
          continue;
        CAPTURE(t);
        auto y = poisoned(size_t(t) * s.n);
        blas.gemm_bf16(nullptr, s.n, s.k, t, false, x->p, w->p, y->p, s.max_t);
        device_sync();
        const size_t count = size_t(t) * s.n;
        CHECK(differing(download(*y, count), natural, count) == 0);
      }
    };
    check_rows(); // the kept algorithm at every row count
    // Then each bucket's pick (tune_fixed: checked against the kept one's bits on its own random
    // rows, in scratch of the largest step), against the chain on these rows.
    {
      auto sx = poisoned(size_t(s.max_t) * s.k / 2), sy = poisoned(size_t(s.max_t) * s.n);
      for (const std::string& line : blas.tune_fixed(s.n, s.k, s.max_t, sx->p, w->p, sy->p))
        MESSAGE(line);
    }
    check_rows();
  }
}
