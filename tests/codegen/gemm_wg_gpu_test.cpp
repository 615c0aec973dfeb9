// GPU checks of the sm_90 warpgroup-MMA gemm (codegen/kernels/gemm_wg.cuh) against ir::ref on
// random inputs, in the tilings the lowering picks (codegen/cuda_lower_wg.cpp): dense linears
// (norm, bias, residual, split K), the grouped MoE block, BF16 and MXFP4 weights; the
// in-register MXFP4 fragment decode against the BF16 dequantisation for every scale byte and
// code; MXFP4 and BF16 weights of equal values give equal bits. Every other tiling:
// gemm_wg_sweep_gpu_test.cpp (label gpu-sweep). Tolerances: tests/codegen/gemm_wg_test_util.h.
#include "tests/codegen/gemm_wg_test_util.h"
#include "tests/codegen/order_chain.h"

using namespace xserv;
using namespace xserv::codegen;
using namespace xserv::kernel_test;
using namespace xserv::kernel_test::wg;

TEST_CASE("the MXFP4 fragment decode of gemm_wg is the BF16 dequantisation, every scale and code") {
  XSERV_REQUIRE_GPU();
  if (!sm90()) {
    MESSAGE("skipped: gemm_wg needs sm_90");
    return;
  }
  // For every scale byte s, 16 words: word c holds code c in all 8 nibbles... and word 16 + c
  // the codes c, c + 1, ..., so every code sits in every nibble under every scale.
  std::vector<uint32_t> words;
  std::vector<uint8_t> scales;
  for (int s = 0; s < 256; ++s)
    for (int w = 0; w < 32; ++w) {
      uint32_t q = 0;
      for (int n = 0; n < 8; ++n)
        q |= uint32_t(w < 16 ? w : (w + n) % 16) << (4 * n);
      words.push_back(q);
      scales.push_back(uint8_t(s));
    }
  KernelSource src;
  src.name = "wg_pair_decode_test";
  src.source =
      "#include \"xserv_kernels/gemm_wg.cuh\"\n"
      "extern \"C\" __global__ void wg_pair_decode_test(const unsigned* q, const unsigned char* s, "
      "unsigned* o, int n) {\n"
      "  const int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
      "  if (i < n)\n"
      "    for (int k = 0; k < 4; ++k)\n"
      "      o[4 * i + k] = xserv_kernels::mxfp4_pair_scaled(xserv_kernels::mx4_pair_raw(q[i], "
      "k), xserv_kernels::mxfp4_scale_factors(s[i]));\n}\n";
  src.launch.block = 256;
  const Loaded& k = load(src);
  const int n = int(words.size());
  auto dq = upload(words), ds = upload(scales);
  auto out = upload(std::vector<uint32_t>(size_t(n) * 4, 0x7fc07fc0u));
  k.module.launch(k.kernel, dim3((n + 255) / 256), dim3(256), 0, nullptr, dq->p, ds->p, out->p, n);
  device_sync();
  std::vector<uint32_t> got(size_t(n) * 4);
  cuda_ok(cudaMemcpy(got.data(), out->p, got.size() * 4, cudaMemcpyDeviceToHost), "download");
  size_t wrong = 0;
  for (int i = 0; i < n; ++i)
    for (int kk = 0; kk < 4; ++kk) {
      uint16_t want[2];
      for (int half = 0; half < 2; ++half) {
        const int code = int(words[size_t(i)] >> (4 * (kk + 4 * half))) & 15;
        // One block whose first byte holds the code: the reference's exact decode.
        uint8_t block[16] = {uint8_t(code)};
        float v[32];
        models::mxfp4_decode_block(block, scales[size_t(i)], v);
        want[half] = models::float_to_bf16(v[0]);
      }
      const uint32_t w = uint32_t(want[0]) | (uint32_t(want[1]) << 16);
      const uint32_t g = got[size_t(i) * 4 + size_t(kk)];
      if (w != g && wrong++ < 8)
        MESSAGE("scale " << int(scales[size_t(i)]) << " word 0x" << std::hex << words[size_t(i)]
                         << " pair " << kk << ": got 0x" << g << " want 0x" << w);
    }
  CHECK(wrong == 0);
}

TEST_CASE("gemm_wg dense kernels match ir::ref (norm, bias, residual, tiles, split K)") {
  XSERV_REQUIRE_GPU();
  if (!sm90()) {
    MESSAGE("skipped: gemm_wg needs sm_90");
    return;
  }
  uint64_t seed = 7000;
  // The lowering's tilings (cuda_lower_wg.cpp): 128-token tiles, two m64 tiles a block for
  // outputs of 4096 and more, one otherwise; 64-token tiles up to 64 tokens. Token tiles
  // partial, whole and ragged; weight rows not a multiple of the block's.
  for (auto [bn, wm] : {std::pair{128, 1}, std::pair{128, 2}, std::pair{64, 1}}) {
    check_dense(dense(2880, 5120, true, false, bn, wm, true), true, 9, ++seed);   // 20b qkv
    check_dense(dense(4096, 2880, true, true, bn, wm, true), false, 300, ++seed); // o_proj
    check_dense(dense(64, 130, false, false, bn, wm, true), false, 40, ++seed);   // ragged N
  }
  check_dense(dense(2880, 32, true, false, 128, 1, true), false, 100, ++seed);   // router logits
  check_dense(dense(2880, 5120, true, false, 128, 2, false), true, 300, ++seed); // plain bf16
  check_dense(dense(4096, 2880, true, true, 64, 1, false), false, 64, ++seed);
  // The router at prompt steps: 64-token tiles with K split 9 ways for 32 weight rows, through
  // the reduce (the lowering's large_split), a ragged last tile included.
  for (int tokens : {512, 1000}) {
    GemmWgDims r = dense(2880, 32, true, false, 64, 1, false);
    r.splitk = 9;
    check_dense(r, false, tokens, ++seed);
  }
  // Split K for few tokens (batched decode).
  for (int tokens : {9, 64}) {
    GemmWgDims q = dense(2880, 5120, true, false, 64, 1, true);
    q.splitk = 5;
    check_dense(q, true, tokens, ++seed);
    GemmWgDims o = dense(4096, 2880, true, true, 64, 1, false);
    o.splitk = 8;
    check_dense(o, false, tokens, ++seed);
  }
}

namespace {

/// `tokens` random fp32 rows of K and bf16 weights [n, k] on the GPU, gemm_act<.., NATURAL>'s
/// bf16 activations of the rows, and the mma.sync chain over natural K of those (the sums a
/// library gemm without split K gives: tests/codegen/order_chain.h).
struct NaturalReference {
  std::unique_ptr<DevBuf> x, w;
  Act act;
  std::vector<float> want;
};
NaturalReference natural_reference(int k, int n, int tokens, uint64_t seed) {
  Rng rng{seed};
  const Tensor x = random_f32(rng, {tokens, k}, 2.0f);
  NaturalReference r;
  r.w = upload(random_bf16(rng, {n, k}, 1.0f / std::sqrt(float(k))).bits);
  r.x = upload(x.f);
  GemmActDims ad{k, false, false, 1e-5, 1};
  ad.natural = true;
  r.act = make_act(ad, tokens, r.x->p, nullptr);
  r.want = run_chain(*r.act.hi, *r.w, tokens, n, k, 0);
  return r;
}

} // namespace

TEST_CASE("gemm_wg in the natural K order: one chain over K, as cuBLAS sums it, bit for bit") {
  XSERV_REQUIRE_GPU();
  if (!sm90()) {
    MESSAGE("skipped: gemm_wg needs sm_90");
    return;
  }
  // Accuracy with the epilogues (norm, bias, residual, split activations) against ir::ref ...
  uint64_t seed = 7600;
  for (auto [bn, wm] : {std::pair{128, 2}, std::pair{64, 1}}) {
    GemmWgDims q = dense(2880, 5120, true, false, bn, wm, false);
    q.natural = true;
    check_dense(q, true, 70, ++seed);
    GemmWgDims o = dense(4096, 2880, true, true, bn, wm, true);
    o.natural = true;
    check_dense(o, false, 33, ++seed);
  }
  // ... and the raw sums bit for bit against an mma.sync chain over K in natural order (the
  // order cuBLAS takes for these shapes from 64 rows: kernels_bench "dense K order"), on the
  // same bf16 activations; every tiling and token count of the lowering's.
  for (auto [k, n] : {std::pair{2880, 5120}, std::pair{4096, 2880}}) {
    const NaturalReference r = natural_reference(k, n, 300, ++seed);
    for (auto [bn, wm] : {std::pair{128, 2}, std::pair{128, 1}, std::pair{64, 1}})
      for (int t : {9, 64, 200, 300}) {
        GemmWgDims d = dense(k, n, false, false, bn, wm, false);
        d.natural = true;
        d.stages = wm == 2 ? 3 : 4;
        const Loaded& l = load(emit_gemm_wg(d, {}));
        auto y = poisoned(size_t(t) * n);
        launch_wg(l, t, r.act, false, r.w->p, nullptr, nullptr, y->p, nullptr, nullptr, nullptr);
        device_sync();
        const std::vector<float> got = download(*y, size_t(t) * n);
        CAPTURE(l.src.name);
        CAPTURE(t);
        CHECK(differing(got, r.want, got.size()) == 0);
      }
  }
  // MXFP4 weights have no natural-order form.
  GemmWgDims m = dense(2880, 5120, true, false, 128, 2, false);
  m.natural = m.mxfp4 = true;
  CHECK_FALSE(gemm_wg_fits(m));
}

TEST_CASE("linear_decode_mma in the natural K order: one chain over K, the natural chain's bits") {
  XSERV_REQUIRE_GPU();
  if (!sm90()) {
    MESSAGE("skipped: the reference activations come from gemm_act (gemm_wg.cuh, sm_90)");
    return;
  }
  // The decode kernel of 1-8 tokens with mma_natural and one K split against the mma.sync chain
  // over natural K of gemm_act<.., NATURAL>'s bf16 activations: the order of a library gemm
  // without split K, for a dense canonical order on cuBLAS (kernels_bench "dense K order").
  uint64_t seed = 7700;
  for (auto [k, n] : {std::pair{2880, 5120}, std::pair{4096, 2880}}) {
    const NaturalReference r = natural_reference(k, n, 8, ++seed);
    for (auto [groups, stages] : {std::pair{4, 8}, std::pair{1, 16}}) {
      LinearDims d{k, n, false, false, false};
      d.round_act = true;
      d.mma = true;
      d.mma_natural = true;
      d.mma_groups = groups;
      d.mma_splits = 1;
      d.mma_stages = stages;
      d.max_tokens = 8;
      REQUIRE(linear_mma_fits(d));
      const Loaded& l = load(emit_linear(d, {}));
      for (int t : {1, 3, 8}) {
        auto y = poisoned(size_t(t) * n);
        launch(l, t, 1, r.x->p, r.w->p, y->p, t);
        device_sync();
        const std::vector<float> got = download(*y, size_t(t) * n);
        CAPTURE(l.src.name);
        CAPTURE(t);
        CHECK(differing(got, r.want, got.size()) == 0);
      }
    }
  }
  LinearDims both{2880, 5120, false, false, false};
  both.round_act = both.mma = both.mma_natural = both.mma_chain = true;
  both.mma_splits = 1;
  CHECK_FALSE(linear_mma_fits(both)); // one K order
}

TEST_CASE("gemm_wg grouped MoE kernels match ir::ref, MXFP4 weights give the BF16 bits") {
  XSERV_REQUIRE_GPU();
  if (!sm90()) {
    MESSAGE("skipped: gemm_wg needs sm_90");
    return;
  }
  uint64_t seed = 7100;
  // The lowering's tilings (codegen::kWgMoeTilings: 16 to 128 tokens a tile, the m64 tiles a
  // block and stages each takes with MXFP4 weights; BF16 weights take one m64 tile below 128
  // tokens): 9 tokens (one partial tile an expert) and 150 (37 pairs an expert on average,
  // skewed: several tiles for the small ones, partial ones for the large).
  const MoeDims small{256, 192, 8, 2, true};
  for (const codegen::WgMoeTiling& t : codegen::kWgMoeTilings) {
    CAPTURE(t.bn);
    run_moe({small, 9, t.bn, t.wm, true, false, true, t.ksub, t.pipe, t.stages}, ++seed);
    const auto bits =
        run_moe({small, 150, t.bn, t.wm, t.bn == 64, true, true, t.ksub, t.pipe, t.stages}, ++seed);
    CHECK(bits[0] == bits[1]);
    if (t.bn != 128)
      run_moe({small, 150, t.bn, 1, false, false, false, t.ksub, t.pipe, t.stages}, ++seed);
  }
  // The 20b's shape: few rows per expert (batched decode) and a prompt's share.
  const MoeDims g20{2880, 2880, 32, 4, true};
  const auto b64 = run_moe({g20, 64, 16, 2, false, false, true}, ++seed);
  CHECK(b64[0] == b64[1]);
  const auto p = run_moe({g20, 200, 64, 2, true, false, true}, ++seed);
  CHECK(p[0] == p[1]);
  const auto big = run_moe({g20, 300, 128, 2, false, true, true, 1, false, 3}, ++seed);
  CHECK(big[0] == big[1]);
}

TEST_CASE("gemm_wg's MMAs as wide as a tile's tokens give each token the same bits") {
  XSERV_REQUIRE_GPU();
  if (!sm90()) {
    MESSAGE("skipped: gemm_wg needs sm_90");
    return;
  }
  // A tile of 64 tokens or more with r of them multiplies only the quarters of its BN columns
  // that cover them (wg_mma_quarters: 16, 32, 48 or 64 of a 64-token tile; 32, 64, 96 or 128 of
  // a 128-token one; 32-token tiles stay whole). A token's row must not depend on which width
  // computed it: its rows alone in the tile's first r against the same rows of a full tile.
  struct Case {
    int bn;
    std::vector<int> tokens; // the last is a full tile
  };
  const Case cases[] = {
      {32, {3, 12, 20, 32}}, {64, {1, 9, 17, 33, 49, 64}}, {128, {20, 40, 70, 100, 128}}};
  Rng rng{7300};
  const int k = 2880, n = 640;
  const Tensor x = random_f32(rng, {128, k}, 2.0f);
  const Bf16Weight w = random_bf16(rng, {n, k}, 1.0f / std::sqrt(float(k)));
  const Bf16Weight b = random_bf16(rng, {n}, 0.5f);
  const Tensor h = random_f32(rng, {128, n}, 1.0f);
  auto dx = upload(x), dw = upload(w.bits), db = upload(b.bits), dh = upload(h);
  const LinearDims d{k, n, false, true, true};
  for (const Case& c : cases) {
    CAPTURE(c.bn);
    const std::vector<uint32_t> full =
        dense_gemm_bits(d, 1, c.bn, c.tokens.back(), *dx, *dw, *db, *dh);
    for (int t : c.tokens) {
      CAPTURE(t);
      const std::vector<uint32_t> got = dense_gemm_bits(d, 1, c.bn, t, *dx, *dw, *db, *dh);
      REQUIRE(got.size() == size_t(t) * n);
      size_t diff = 0;
      for (size_t i = 0; i < got.size(); ++i)
        diff += got[i] != full[i];
      CHECK(diff == 0);
    }
  }
}

TEST_CASE("gemm_wg's one-multiply MXFP4 scaling gives the BF16 weights' bits") {
  XSERV_REQUIRE_GPU();
  if (!sm90()) {
    MESSAGE("skipped: gemm_wg needs sm_90");
    return;
  }
  // Scale bytes up to 128 (a plan's mxfp4_max_scale): one multiply by 2^(s - 1) a pair, where
  // the general form multiplies again by 1. The MXFP4 run against the same values as BF16
  // weights, bit for bit, in every MoE tiling of the lowering and with scales right up to 128.
  uint64_t seed = 7500;
  const MoeDims small{256, 192, 8, 2, true};
  for (const codegen::WgMoeTiling& t : codegen::kWgMoeTilings) {
    CAPTURE(t.bn);
    MoeCase c{small, 150, t.bn, t.wm, false, true, true, t.ksub, t.pipe, t.stages};
    c.small_scales = true;
    const auto bits = run_moe(c, ++seed);
    CHECK(bits[0] == bits[1]);
    c.scale_lo = 124; // to 128, inclusive: the largest one multiply takes
    c.check_accuracy = false;
    const auto top = run_moe(c, ++seed);
    CHECK(top[0] == top[1]);
  }
  const MoeDims g20{2880, 2880, 32, 4, true};
  MoeCase b256{g20, 256, 64, 2, false, false, true};
  b256.small_scales = true;
  const auto b = run_moe(b256, ++seed);
  CHECK(b[0] == b[1]);
}

TEST_CASE("gemm_wg's K steps as MMA batches of their own give the same bits") {
  XSERV_REQUIRE_GPU();
  if (!sm90()) {
    MESSAGE("skipped: gemm_wg needs sm_90");
    return;
  }
  // GemmWgDims::steps changes when the MMAs issue and are waited for, not what they multiply:
  // both weight formats' outputs equal those of the batched schedule bit for bit, in every MoE
  // tiling of the lowering (with their stages and K tiles a stage) and at the 20b's shape.
  uint64_t seed = 7700;
  auto same = [&](MoeCase c) {
    c.steps = false;
    const auto want = run_moe(c, seed);
    c.steps = true;
    const auto got = run_moe(c, seed);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i)
      CHECK(got[i] == want[i]);
    ++seed;
  };
  const MoeDims small{256, 192, 8, 2, true};
  for (const codegen::WgMoeTiling& t : codegen::kWgMoeTilings) {
    CAPTURE(t.bn);
    MoeCase c{small, 150, t.bn, t.wm, false, true, true, t.ksub, false, t.stages};
    c.small_scales = true;
    same(c);
    c.small_scales = false;
    c.tokens = 9;
    same(c);
  }
  const MoeDims g20{2880, 2880, 32, 4, true};
  MoeCase b256{g20, 256, 64, 2, false, false, true};
  b256.small_scales = true;
  same(b256);
  const int stages = codegen::kWgMoeTilings.back().stages; // the lowering's 128-token tile's
  MoeCase prompt{g20, 300, 128, 2, false, true, true, 1, false, stages};
  prompt.small_scales = true;
  same(prompt);
}
