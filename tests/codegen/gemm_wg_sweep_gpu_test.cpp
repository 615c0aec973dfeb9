// Every gemm_wg tiling the kernel accepts, beyond the ones the lowering picks
// (gemm_wg_gpu_test.cpp): token tiles of 16, 64 and 128 with one or two m64 tiles a block,
// 256-token tiles, stages of 1, 2 and 3 K tiles with MMAs left in flight, dense and grouped,
// against ir::ref within the tolerances of tests/codegen/gemm_wg_test_util.h. An exhaustive
// sweep for kernel work (ctest label gpu-sweep), not part of the default GPU suite.
#include "tests/codegen/gemm_wg_test_util.h"

using namespace xserv;
using namespace xserv::codegen;
using namespace xserv::kernel_test;
using namespace xserv::kernel_test::wg;

TEST_CASE("sweep: gemm_wg dense kernels in every tiling match ir::ref") {
  XSERV_REQUIRE_GPU();
  if (!sm90()) {
    MESSAGE("skipped: gemm_wg needs sm_90");
    return;
  }
  uint64_t seed = 8000;
  for (int bn : {16, 64, 128}) {
    for (int wm : {1, 2}) {
      check_dense(dense(2880, 5120, true, false, bn, wm, true), true, 9, ++seed);   // 20b qkv
      check_dense(dense(4096, 2880, true, true, bn, wm, true), false, 300, ++seed); // o_proj
      check_dense(dense(64, 130, false, false, bn, wm, true), false, 40, ++seed);   // ragged N
    }
  }
  // Stages of 2 and 3 K tiles (the last stage short for 2880 = 45 tiles), MMAs left in flight.
  // Three K tiles a stage at 128 tokens x 128 rows would need 288 KB of shared memory: that
  // variant runs at 64 x 64 (every variant here must pass gemm_wg_fits, checked first).
  for (auto [ksub, pipe] :
       {std::pair{2, false}, std::pair{2, true}, std::pair{1, true}, std::pair{3, true}}) {
    GemmWgDims q = dense(2880, 5120, true, false, ksub == 3 ? 64 : 128, ksub == 3 ? 1 : 2, false);
    q.ksub = ksub;
    q.pipe = pipe;
    q.stages = 3;
    REQUIRE(gemm_wg_fits(q));
    check_dense(q, true, 300, ++seed);
    GemmWgDims o = dense(4096, 2880, true, true, 64, 1, true);
    o.ksub = ksub;
    o.pipe = pipe;
    o.stages = ksub == 3 ? 3 : 4; // 4 stages of 3 split K tiles: 288 KB
    REQUIRE(gemm_wg_fits(o));
    check_dense(o, false, 64, ++seed);
  }
  GemmWgDims wide = dense(2880, 5120, true, false, 256, 1, true);
  wide.stages = 3;
  check_dense(wide, true, 600, ++seed);
}

TEST_CASE("sweep: gemm_wg grouped MoE kernels in every tiling match ir::ref") {
  XSERV_REQUIRE_GPU();
  if (!sm90()) {
    MESSAGE("skipped: gemm_wg needs sm_90");
    return;
  }
  uint64_t seed = 8100;
  const MoeDims small{256, 192, 8, 2, true};
  for (int bn : {16, 64, 128})
    for (int wm : {1, 2}) {
      run_moe({small, 9, bn, wm, true, false, true}, ++seed);
      run_moe({small, 150, bn, wm, false, false, false}, ++seed);
      const auto bits = run_moe({small, 150, bn, wm, bn == 64, true, true}, ++seed);
      CHECK(bits[0] == bits[1]);
    }
  const MoeDims g20{2880, 2880, 32, 4, true};
  run_moe({{1024, 1024, 8, 4, true}, 300, 128, 1, false, true, true}, ++seed);
  // Stages of 2 K tiles (2880: the last one short), MMAs left in flight.
  for (auto [bn, ksub, pipe] : {std::tuple{16, 2, true}, std::tuple{64, 2, true},
                                std::tuple{64, 1, true}, std::tuple{128, 2, false}}) {
    const int stages = bn == 128 ? 3 : 4; // 128-token stages of 2 tiles: 193 KB in 3
    const auto bits = run_moe({g20, 150, bn, 2, false, false, true, ksub, pipe, stages}, ++seed);
    CHECK(bits[0] == bits[1]);
  }
}
