// MXFP4 experts kept as MXFP4 on the GPU (codegen/kernels/mxfp4.cuh): the in-register decode is
// the BF16 dequantisation bit for bit; the grouped gemms that read MXFP4 give bitwise the
// outputs of their BF16 twins on the dequantised weights (same products, same order), and the
// decode GEMVs (sums grouped by 32-value block) agree with theirs within a rounding per block.
#include "tests/codegen/kernel_test_util.h"

#include "ir/reference.h"
#include "models/bf16.h"
#include "models/mxfp4.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

using namespace xserv;
using namespace xserv::codegen;
using namespace xserv::kernel_test;
using ir::DType;
using ir::Tensor;

namespace {

/// An MXFP4 tensor of [experts, rows, cols] values: the device bytes (blocks then scales, as
/// runtime::WeightSpec::Transform::Mxfp4 lays them out) and its BF16 dequantisation.
struct Mxfp4Weight {
  std::vector<uint8_t> device;
  std::vector<uint16_t> bf16;
};

/// Random codes; scale bytes drawn from [lo, hi] (around 2^-7..2^2 for realistic weights; above
/// 128 exercises the decode's second multiply).
Mxfp4Weight random_mxfp4(Rng& rng, int experts, int rows, int cols, int lo, int hi) {
  const size_t n = size_t(experts) * rows * cols, blocks = n / 32;
  Mxfp4Weight w;
  w.device.resize(n / 2 + blocks);
  for (size_t i = 0; i < n / 2; ++i)
    w.device[i] = uint8_t(int((rng.next(1.0f) + 1.0f) * 128.0f) & 0xff);
  for (size_t b = 0; b < blocks; ++b)
    w.device[n / 2 + b] =
        uint8_t(lo + int((rng.next(1.0f) + 1.0f) * 0.5f * float(hi - lo + 1)) % (hi - lo + 1));
  std::vector<float> f(n);
  models::mxfp4_decode_row({w.device.data(), n / 2}, {w.device.data() + n / 2, blocks}, f);
  w.bf16.resize(n);
  for (size_t i = 0; i < n; ++i)
    w.bf16[i] = models::float_to_bf16(f[i]);
  return w;
}

/// The dequantised values as the fp32 tensor ir::ref reads.
Tensor as_tensor(const Mxfp4Weight& w, std::vector<int64_t> shape) {
  Tensor t = Tensor::zeros(DType::F32, std::move(shape));
  for (size_t i = 0; i < t.f.size(); ++i)
    t.f[i] = models::bf16_to_float(w.bf16[i]);
  return t;
}

std::vector<uint32_t> download_bits(const DevBuf& b, size_t n) {
  std::vector<uint32_t> v(n);
  cuda_ok(cudaMemcpy(v.data(), b.p, n * sizeof(uint32_t), cudaMemcpyDeviceToHost), "download");
  return v;
}

std::vector<float> as_floats(const std::vector<uint32_t>& bits) {
  std::vector<float> f(bits.size());
  std::memcpy(f.data(), bits.data(), bits.size() * 4);
  return f;
}

/// Elements of `a` and `b` whose bits differ.
size_t differing(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  size_t d = 0;
  for (size_t i = 0; i < a.size(); ++i)
    d += a[i] != b[i];
  return d;
}

} // namespace

TEST_CASE("the in-register MXFP4 decode is the BF16 dequantisation for every scale and code") {
  XSERV_REQUIRE_GPU();
  // Block s has scale byte s and holds the 16 codes twice (byte j: codes 2j and 2j + 1 mod 16).
  const int blocks = 256;
  std::vector<uint8_t> bytes(size_t(blocks) * 17);
  for (int s = 0; s < blocks; ++s) {
    for (int j = 0; j < 16; ++j)
      bytes[size_t(s) * 16 + size_t(j)] = uint8_t(((2 * j) % 16) | (((2 * j + 1) % 16) << 4));
    bytes[size_t(blocks) * 16 + size_t(s)] = uint8_t(s);
  }
  KernelSource src;
  src.name = "mxfp4_decode_all_test";
  src.source = "#include \"xserv_kernels/mxfp4.cuh\"\n"
               "extern \"C\" __global__ void mxfp4_decode_all_test(const unsigned char* b, const "
               "unsigned char* s, __nv_bfloat16* o, long long n) {\n"
               "  xserv_kernels::mxfp4_decode_all(b, s, o, n);\n}\n";
  src.launch.block = 256;
  const Loaded& k = load(src);
  auto dev = upload(bytes);
  const size_t n = size_t(blocks) * 32;
  auto out = upload(std::vector<uint16_t>(n, 0x7fff));
  const uint8_t* db = static_cast<const uint8_t*>(dev->p);
  k.module.launch(k.kernel, dim3(4), dim3(256), 0, nullptr, db, db + size_t(blocks) * 16, out->p,
                  (long long)n);
  device_sync();
  std::vector<uint16_t> got(n);
  cuda_ok(cudaMemcpy(got.data(), out->p, n * 2, cudaMemcpyDeviceToHost), "download");
  size_t wrong = 0;
  for (int s = 0; s < blocks; ++s) {
    float want[32];
    models::mxfp4_decode_block(&bytes[size_t(s) * 16], uint8_t(s), want);
    for (int i = 0; i < 32; ++i) {
      const uint16_t w = models::float_to_bf16(want[i]), g = got[size_t(s) * 32 + size_t(i)];
      if (w != g && wrong++ < 8)
        MESSAGE("scale " << s << " value " << i << ": got 0x" << std::hex << g << " want 0x" << w);
    }
  }
  CHECK(wrong == 0);
}

TEST_CASE("MoE decode kernels on MXFP4 experts agree with the BF16 kernels") {
  XSERV_REQUIRE_GPU();
  uint64_t seed = 9100;
  for (MoeDims d : {MoeDims{64, 64, 8, 2, true}, MoeDims{2880, 2880, 32, 4, true}}) {
    Rng rng{++seed};
    // Scales 117..130: weights of 2^-10..6 * 2^3 (the decode's second path above 128).
    const Mxfp4Weight gu = random_mxfp4(rng, d.experts, 2 * d.inter, d.hidden, 117, 130);
    const Mxfp4Weight dn = random_mxfp4(rng, d.experts, d.hidden, d.inter, 117, 130);
    const Bf16Weight gub = random_bf16(rng, {d.experts, 2 * d.inter}, 0.5f);
    const Bf16Weight dnb = random_bf16(rng, {d.experts, d.hidden}, 0.5f);
    auto dgu = upload(gu.bf16), ddn = upload(dn.bf16), dgu4 = upload(gu.device),
         ddn4 = upload(dn.device), dgub = upload(gub.bits), ddnb = upload(dnb.bits);
    for (int tokens : {1, 5}) {
      const Tensor x = random_f32(rng, {tokens, d.hidden}, 3.0f);
      Tensor w = random_f32(rng, {tokens, d.k}, 1.0f),
             ids = Tensor::zeros(DType::I32, {tokens, d.k});
      for (int t = 0; t < tokens; ++t)
        for (int j = 0; j < d.k; ++j)
          ids.i[size_t(t * d.k + j)] = (t * 7 + j * 3) % d.experts;
      auto dx = upload(x), dw = upload(w), dids = upload(ids);
      const size_t acts = size_t(tokens) * d.k * d.inter, parts = size_t(tokens) * d.k * d.hidden;
      std::vector<uint32_t> act_bits[2], part_bits[2];
      std::vector<float> y[2];
      for (int mx = 0; mx < 2; ++mx) {
        MoeDims dd = d;
        dd.mxfp4 = mx == 1;
        const Loaded& kgu = load(emit_moe_gate_up(dd, {}));
        const Loaded& kdn = load(emit_moe_down_part(dd, {}));
        const Loaded& comb = load(emit_moe_combine(d.hidden, d.k, false, {}));
        auto act = poisoned(acts), part = poisoned(parts);
        auto out = poisoned(size_t(tokens) * d.hidden);
        launch(kgu, tokens, 1, dx->p, dids->p, mx ? dgu4->p : dgu->p, dgub->p, act->p);
        launch(kdn, tokens, 1, act->p, dw->p, dids->p, mx ? ddn4->p : ddn->p, ddnb->p, part->p);
        launch(comb, tokens, 1, part->p, out->p);
        device_sync();
        act_bits[mx] = download_bits(*act, acts);
        part_bits[mx] = download_bits(*part, parts);
        y[mx] = download(*out, size_t(tokens) * d.hidden);
      }
      // Both against ir::ref (double sums) on the dequantised weights: the MXFP4 kernels are
      // held to be as accurate as the BF16 ones (their sums are only grouped otherwise).
      const Tensor want = ir::ref::moe_experts(
          x, w, ids, as_tensor(gu, {d.experts, 2 * d.inter, d.hidden}), gub.t,
          as_tensor(dn, {d.experts, d.hidden, d.inter}), dnb.t, d.limit, d.alpha);
      const double ref_bf16 = rel_l2(y[0], want.f), ref_mx = rel_l2(y[1], want.f);
      MESSAGE("against ir::ref, hidden " << d.hidden << ", " << tokens << " tokens: BF16 kernels "
                                         << ref_bf16 << ", MXFP4 kernels " << ref_mx);
      CHECK(ref_mx <= std::max(2 * ref_bf16, 1e-6));
      INFO("hidden " << d.hidden << ", tokens " << tokens);
      const double e_act = rel_l2(as_floats(act_bits[1]), as_floats(act_bits[0]));
      const double e_part = rel_l2(as_floats(part_bits[1]), as_floats(part_bits[0]));
      MESSAGE("MXFP4 vs BF16 decode kernels, hidden "
              << d.hidden << ", " << tokens << " tokens: rel L2 act " << e_act << ", down "
              << e_part);
      // The BF16 kernels' own bound against ir::ref (kernels_gpu_test.cpp): the grouping of the
      // sums by block moves them by about one rounding per block.
      CHECK(e_act <= 3e-6);
      CHECK(e_part <= 3e-6);
    }
  }
}

TEST_CASE("tensor-core MoE decode kernels on MXFP4 experts agree with the FMA kernels and a "
          "double reference") {
  XSERV_REQUIRE_GPU();
  uint64_t seed = 9150;
  struct Tiling {
    int groups, splits, chunk, stages; // stages 0: words straight into registers
  };
  // 96: three blocks a row (one scale byte at a time).
  for (MoeDims d : {MoeDims{64, 64, 8, 2, false}, MoeDims{96, 96, 8, 2, false},
                    MoeDims{2880, 2880, 32, 4, false}})
    // Scales around realistic weights, a wider spread, and bytes past 192 (the block sum's
    // second multiply).
    for (auto [lo, hi] : {std::pair{117, 130}, std::pair{100, 140}, std::pair{185, 200}}) {
      Rng rng{++seed};
      d.mxfp4 = true;
      d.round_act = true;
      const Mxfp4Weight gu = random_mxfp4(rng, d.experts, 2 * d.inter, d.hidden, lo, hi);
      const Mxfp4Weight dn = random_mxfp4(rng, d.experts, d.hidden, d.inter, lo, hi);
      const Bf16Weight gub = random_bf16(rng, {d.experts, 2 * d.inter}, 0.5f);
      const Bf16Weight dnb = random_bf16(rng, {d.experts, d.hidden}, 0.5f);
      auto dgu4 = upload(gu.device), dgub = upload(gub.bits), ddn4 = upload(dn.device),
           ddnb = upload(dnb.bits);
      const int tokens = 3, pairs = tokens * d.k;
      const Tensor x = random_f32(rng, {tokens, d.hidden}, 2.0f);
      const Tensor act = random_f32(rng, {pairs, d.inter}, 2.0f);
      const Tensor w = random_f32(rng, {pairs}, 1.0f);
      Tensor ids = Tensor::zeros(DType::I32, {pairs});
      for (int j = 0; j < pairs; ++j)
        ids.i[size_t(j)] = (j * 5 + 3) % d.experts;
      auto dx = upload(x), dact = upload(act), dw = upload(w), dids = upload(ids);
      // Double sums of the dequantised weights and the bf16-rounded activations the kernels
      // take; the SwiGLU in double.
      auto dot = [](const Mxfp4Weight& m, size_t row, int n, const float* v) {
        double sum = 0.0;
        for (int i = 0; i < n; ++i)
          sum += double(models::bf16_to_float(m.bf16[row * size_t(n) + size_t(i)])) *
                 double(models::bf16_to_float(models::float_to_bf16(v[i])));
        return sum;
      };
      std::vector<float> want_act(size_t(pairs) * d.inter), want_part(size_t(pairs) * d.hidden);
      for (int j = 0; j < pairs; ++j) {
        const size_t e = size_t(ids.i[size_t(j)]);
        const float* xt = &x.f[size_t(j / d.k) * d.hidden];
        for (int i = 0; i < d.inter; ++i) {
          const size_t r = e * 2 * d.inter + 2 * size_t(i);
          double gate = dot(gu, r, d.hidden, xt) + models::bf16_to_float(gub.bits[r]);
          double up = dot(gu, r + 1, d.hidden, xt) + models::bf16_to_float(gub.bits[r + 1]);
          gate = std::min(gate, d.limit);
          up = std::clamp(up, -d.limit, d.limit);
          want_act[size_t(j) * d.inter + i] =
              float((up + 1.0) * gate / (1.0 + std::exp(-d.alpha * gate)));
        }
        for (int o = 0; o < d.hidden; ++o) {
          const size_t r = e * d.hidden + size_t(o);
          want_part[size_t(j) * d.hidden + o] =
              float(double(w.f[size_t(j)]) * (dot(dn, r, d.inter, &act.f[size_t(j) * d.inter]) +
                                              models::bf16_to_float(dnb.bits[r])));
        }
      }
      auto run = [&](const MoeDims& v, std::vector<float>& a, std::vector<float>& p) {
        const Loaded& kgu = load(emit_moe_gate_up(v, {}));
        const Loaded& kdn = load(emit_moe_down_part(v, {}));
        auto dacto = poisoned(want_act.size()), dpart = poisoned(want_part.size());
        launch(kgu, tokens, 1, dx->p, dids->p, dgu4->p, dgub->p, dacto->p);
        launch(kdn, tokens, 1, dact->p, dw->p, dids->p, ddn4->p, ddnb->p, dpart->p);
        device_sync();
        a = download(*dacto, want_act.size());
        p = download(*dpart, want_part.size());
      };
      std::vector<float> fma_act, fma_part;
      run(d, fma_act, fma_part);
      const double fma_a = rel_l2(fma_act, want_act), fma_p = rel_l2(fma_part, want_part);
      for (const Tiling& t :
           {Tiling{0, 0, 0, 0}, Tiling{1, 3, 2, 0}, Tiling{2, 1, 4, 0}, Tiling{1, 8, 6, 0},
            Tiling{0, 0, 0, 4}, Tiling{1, 3, 8, 2}, Tiling{2, 1, 8, 3}, Tiling{1, 4, 8, 6}}) {
        MoeDims v = d;
        v.mma = true;
        v.mma_groups = t.groups;
        v.mma_splits = t.splits;
        v.mma_chunk = t.chunk;
        v.mma_stages = t.stages;
        if (!moe_mma_fits(v))
          continue;
        std::vector<float> mma_act, mma_part;
        run(v, mma_act, mma_part);
        const double a = rel_l2(mma_act, want_act), p = rel_l2(mma_part, want_part);
        const double a_fma = rel_l2(mma_act, fma_act), p_fma = rel_l2(mma_part, fma_part);
        MESSAGE("hidden " << d.hidden << ", scales " << lo << ".." << hi << ", tiling " << t.groups
                          << "/" << t.splits << "/" << t.chunk << " stages " << t.stages
                          << ": against the double reference gate_up FMA " << fma_a
                          << " tensor cores " << a << ", down FMA " << fma_p << " tensor cores "
                          << p << "; tensor cores against FMA " << a_fma << ", " << p_fma);
        INFO("hidden " << d.hidden << ", scales " << lo << ".." << hi << ", tiling " << t.groups
                       << "/" << t.splits << "/" << t.chunk << " stages " << t.stages);
        // Exact products, fp32 sums per block in another order: as accurate as the FMA
        // kernels (fails if the tensor cores flush the bf16 subnormal +-0.5 decodes to, or a
        // tile skips or repeats blocks), within a few roundings of them.
        CHECK(a <= std::max(2 * fma_a, 1e-6));
        CHECK(p <= std::max(2 * fma_p, 1e-6));
        CHECK(a_fma <= 3e-6);
        CHECK(p_fma <= 3e-6);
      }
    }
}

TEST_CASE("grouped MoE gemms on MXFP4 experts equal the BF16 gemms bit for bit") {
  XSERV_REQUIRE_GPU();
  uint64_t seed = 9200;
  struct Case {
    MoeDims d;
    int tokens, bm;
    bool split;
  };
  for (const Case& c :
       {Case{{256, 192, 8, 2, false}, 150, 32, true}, Case{{256, 192, 8, 2, false}, 150, 64, false},
        Case{{256, 192, 8, 2, false}, 150, 128, true},
        Case{{2880, 2880, 32, 4, false}, 40, 32, true}}) {
    const MoeDims& d = c.d;
    Rng rng{++seed};
    const Mxfp4Weight gu = random_mxfp4(rng, d.experts, 2 * d.inter, d.hidden, 117, 130);
    const Mxfp4Weight dn = random_mxfp4(rng, d.experts, d.hidden, d.inter, 117, 130);
    const Bf16Weight gub = random_bf16(rng, {d.experts, 2 * d.inter}, 0.5f);
    const Bf16Weight dnb = random_bf16(rng, {d.experts, d.hidden}, 0.5f);
    const Tensor x = random_f32(rng, {c.tokens, d.hidden}, 3.0f);
    Tensor w = random_f32(rng, {c.tokens, d.k}, 1.0f);
    Tensor ids = Tensor::zeros(DType::I32, {c.tokens, d.k});
    for (int t = 0; t < c.tokens; ++t)
      for (int j = 0; j < d.k; ++j)
        ids.i[size_t(t * d.k + j)] = (t * 5 + j * 3 + t / 7) % d.experts;
    const int pairs = c.tokens * d.k;
    auto dx = upload(x), dw = upload(w), dids = upload(ids);
    auto dgu = upload(gu.bf16), ddn = upload(dn.bf16), dgu4 = upload(gu.device),
         ddn4 = upload(dn.device), dgub = upload(gub.bits), ddnb = upload(dnb.bits);
    auto pair = upload(std::vector<int32_t>(size_t(pairs), -7));
    auto tiles = upload(std::vector<int32_t>(moe_tiles_ints(pairs, d.experts, c.bm), -7));
    launch(load(emit_moe_sort({d.experts, d.k, c.bm, pairs}, {})), c.tokens, 1, dids->p, pair->p,
           tiles->p, c.tokens);
    const size_t acts = size_t(pairs) * d.inter, parts = size_t(pairs) * d.hidden;
    std::vector<uint32_t> act_bits[2], part_bits[2];
    for (int mx = 0; mx < 2; ++mx) {
      GemmDims gd;
      gd.grouped = true;
      gd.experts = d.experts;
      gd.ksel = d.k;
      gd.bm = c.bm;
      gd.split = c.split;
      gd.mxfp4 = mx == 1;
      gd.k = d.hidden;
      gd.n = 2 * d.inter;
      gd.gather = true;
      gd.epilogue = GemmEpilogue::Swiglu;
      const Loaded& kgu = load(emit_gemm(gd, {}));
      gd.k = d.inter;
      gd.n = d.hidden;
      gd.gather = false;
      gd.epilogue = GemmEpilogue::Scatter;
      const Loaded& kdn = load(emit_gemm(gd, {}));
      auto act = poisoned(acts), part = poisoned(parts);
      launch(kgu, c.tokens, 1, dx->p, nullptr, nullptr, mx ? dgu4->p : dgu->p, dgub->p, nullptr,
             act->p, pair->p, tiles->p, nullptr, c.tokens);
      launch(kdn, c.tokens, 1, act->p, nullptr, nullptr, mx ? ddn4->p : ddn->p, ddnb->p, nullptr,
             part->p, pair->p, tiles->p, dw->p, c.tokens);
      device_sync();
      act_bits[mx] = download_bits(*act, acts);
      part_bits[mx] = download_bits(*part, parts);
    }
    INFO("hidden " << d.hidden << ", tokens " << c.tokens << ", bm " << c.bm);
    CHECK(differing(act_bits[0], act_bits[1]) == 0);
    CHECK(differing(part_bits[0], part_bits[1]) == 0);
    float probe = 0;
    std::memcpy(&probe, &part_bits[1][0], 4);
    CHECK(probe == probe);
  }
}
