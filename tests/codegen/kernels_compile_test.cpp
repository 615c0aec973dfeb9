// Every decode kernel the emitter makes for the tiny, 20b and 120b dimensions compiles with NVRTC.
#include "codegen/emit.h"
#include "codegen/emit_prefill.h"
#include "codegen/emit_wg.h"
#include "models/config.h"
#include "runtime/nvrtc.h"
#include "tests/test_util.h"

#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <tuple>

using namespace xserv;
using namespace xserv::codegen;

namespace {

/// The decode kernels of one model: one per distinct (op, dimensions) of its layers.
std::vector<KernelSource> model_kernels(const models::ModelConfig& c) {
  const int d = int(c.hidden_size), q = int(c.q_width()), kv = int(c.kv_width());
  std::vector<KernelSource> out;
  out.push_back(emit_linear({d, q + 2 * kv, true, true, false, c.rms_norm_eps}, {"qkv"}));
  out.push_back(emit_linear({q, d, false, true, true}, {"o_proj + residual"}));
  LinearDims om{q, d, false, true, true}; // on tensor cores, bf16 activations
  om.round_act = true;
  om.mma = true;
  if (linear_mma_fits(om))
    out.push_back(emit_linear(om, {"o_proj + residual, tensor cores"}));
  om.mma_chain = true; // the canonical order, the gemm's K split
  om.mma_splits = wg_splitk(q, d);
  if (linear_mma_fits(om))
    out.push_back(emit_linear(om, {"o_proj + residual, canonical order"}));
  om.mma_chain = false; // one chain over natural K (cuBLAS's order without split K)
  om.mma_natural = true;
  om.mma_splits = 1;
  om.mma_groups = 4;
  om.mma_stages = 8;
  if (linear_mma_fits(om))
    out.push_back(emit_linear(om, {"o_proj + residual, natural K order"}));
  for (bool round : {false, true}) { // one token, the rows resident in shared memory (sm_90)
    LinearDims os{q, d, false, true, true};
    os.max_tokens = 1;
    os.smem = true;
    os.round_act = round;
    if (linear_smem_rows(os) > 0)
      out.push_back(emit_linear(os, {"o_proj + residual, rows in shared memory"}));
    os.mma_chain = true; // ... in the canonical order
    os.mma_splits = wg_splitk(q, d);
    if (linear_smem_chain_fits(os))
      out.push_back(emit_linear(os, {"o_proj + residual, rows in shared memory, canonical"}));
  }
  out.push_back(emit_linear({d, int(c.num_local_experts), true, true, false, c.rms_norm_eps},
                            {"router logits"}));
  out.push_back(
      emit_linear({d, int(c.vocab_size), true, false, false, c.rms_norm_eps}, {"lm_head"}));
  // Paged caches: blocks of 16, tables of 4096 positions.
  AttentionDims att{
      int(c.num_attention_heads), int(c.num_key_value_heads),         int(c.head_dim), 16, 256,
      int(c.sliding_window),      1.0 / std::sqrt(double(c.head_dim))};
  out.push_back(emit_attention_decode(att, {"sliding attention"}));
  att.window = 0;
  out.push_back(emit_attention_decode(att, {"full attention"}));
  att.f32_cache = true;
  out.push_back(emit_attention_decode(att, {"full attention, fp32 KV cache"}));
  out.push_back(emit_attention_combine(att, {"attention combine"}));
  // The canonical order of plain bf16 plans (attention_mma.cuh): decode and combine.
  for (bool f32 : {false, true})
    for (int window : {0, int(c.sliding_window)}) {
      AttentionDims can = att;
      can.f32_cache = f32;
      can.window = window;
      can.chunk = 128;
      out.push_back(emit_attention_decode_mma(can, {"attention, canonical order"}));
    }
  out.push_back(emit_attention_combine_chunks(att, {"attention chunk combine"}));
  // Prompt steps on tensor cores (plain and split plans), both caches, both kinds.
  for (bool f32 : {false, true})
    for (int window : {0, int(c.sliding_window)}) {
      AttentionDims pre = att;
      pre.f32_cache = f32;
      pre.window = window;
      pre.chunk = 128;
      out.push_back(emit_attention_prefill_mma(pre, {"prefill attention, tensor cores"}));
      pre.split = true; // the split plans' operand pairs
      out.push_back(emit_attention_prefill_mma(pre, {"prefill attention, operand pairs"}));
      out.push_back(emit_attention_decode_mma(pre, {"attention, operand pairs"}));
    }
  for (bool f32 : {false, true})
    for (int window : {0, int(c.sliding_window)})
      out.push_back(emit_kv_write(
          {int(c.num_key_value_heads), int(c.head_dim), 16, 256, window, f32}, {"kv_write"}));
  MoeDims moe{d,
              int(c.intermediate_size),
              int(c.num_local_experts),
              int(c.num_experts_per_tok),
              true,
              c.swiglu_limit,
              c.swiglu_alpha};
  out.push_back(emit_moe_gate_up(moe, {"moe gate_up"}));
  out.push_back(emit_moe_down(moe, {"moe down"}));
  out.push_back(emit_moe_down_part(moe, {"moe down part"}));
  moe.mxfp4 = true; // the same decode kernels on MXFP4 experts
  out.push_back(emit_moe_gate_up(moe, {"moe gate_up, mxfp4"}));
  out.push_back(emit_moe_down_part(moe, {"moe down part, mxfp4"}));
  // A plan with plain bf16 gemm activations: every decode kernel rounds its staged inputs.
  LinearDims qkv{d, q + 2 * kv, true, true, false, c.rms_norm_eps};
  qkv.round_act = true;
  out.push_back(emit_linear(qkv, {"qkv, bf16 activations"}));
  QkvDims qd{d, q, kv, kv, c.rms_norm_eps};
  qd.round_act = true;
  if (qkv_decode_fits(qd))
    out.push_back(emit_qkv_decode(qd, {"qkv_decode, bf16 activations"}));
  RouterTopKDims rd{int(c.num_local_experts), int(c.num_experts_per_tok), true};
  if (norm_router_topk_fits(d, rd))
    out.push_back(emit_norm_router_topk(d, rd, c.rms_norm_eps, true, {"router, bf16 activations"}));
  for (bool mx : {false, true}) {
    moe.mxfp4 = mx;
    moe.round_act = true;
    out.push_back(emit_moe_gate_up(moe, {"moe gate_up, bf16 activations"}));
    out.push_back(emit_moe_down_part(moe, {"moe down part, bf16 activations"}));
  }
  moe.mma = true; // on tensor cores (MXFP4, bf16 activations), default and odd tilings
  for (auto [groups, splits, chunk, stages] : {std::tuple{0, 0, 0, 0}, std::tuple{1, 3, 2, 0},
                                               std::tuple{0, 0, 0, 4}, std::tuple{1, 3, 0, 2}}) {
    moe.mma_groups = groups;
    moe.mma_splits = splits;
    moe.mma_chunk = chunk;
    moe.mma_stages = stages;
    if (moe_mma_fits(moe)) {
      out.push_back(emit_moe_gate_up(moe, {"moe gate_up, tensor cores"}));
      out.push_back(emit_moe_down_part(moe, {"moe down part, tensor cores"}));
    }
  }
  moe.mma_chain = true; // the canonical order (the lowering's on sm_90), and rings of 3
  moe.mma_groups = moe.mma_splits = moe.mma_chunk = 0;
  for (int stages : {2, 3}) {
    moe.mma_stages = stages;
    if (moe_mma_fits(moe)) {
      out.push_back(emit_moe_gate_up(moe, {"moe gate_up, canonical order"}));
      out.push_back(emit_moe_down_part(moe, {"moe down part, canonical order"}));
    }
    MoeDims mc = moe; // ... with the tokens of 7-8-token steps as the MMA's columns
    mc.mma_cols = true;
    if (moe_cols_fits(mc)) {
      out.push_back(emit_moe_gate_up(mc, {"moe gate_up, canonical order, tokens as columns"}));
      out.push_back(emit_moe_down_part(mc, {"moe down part, canonical order, tokens as columns"}));
    }
  }
  moe.mma_chain = false;
  QkvDims qr = qd; // decode qkv with RoPE and the cache writes in its epilogue
  qr.head_dim = int(c.head_dim);
  qr.block = 16;
  qr.table = 256;
  qr.attention_factor = 1.25;
  qr.f32_cache = true;
  if (qkv_decode_fits(qr))
    out.push_back(emit_qkv_decode(qr, {"qkv_rope_decode"}));
  // Canonical plans' fused decode kernels: the gemms' K splits (the lowering's), one token and
  // up to 8, both caches; the router with its norm and top-k.
  QkvDims qc = qr;
  qc.chain_q = wg_splitk(d, q);
  qc.chain_kv = wg_splitk(d, kv);
  for (int tokens : {1, 8})
    for (bool f32 : {false, true}) {
      qc.max_tokens = tokens;
      qc.f32_cache = f32;
      REQUIRE(qkv_chain_fits(qc));
      out.push_back(emit_qkv_rope_chain(qc, {"qkv_rope_decode, canonical order"}));
    }
  // ... and as one chain over natural K each (cuBLAS's order without split K).
  qc.chain_q = qc.chain_kv = 1;
  qc.chain_natural = true;
  for (int tokens : {1, 8}) {
    qc.max_tokens = tokens;
    REQUIRE(qkv_chain_fits(qc));
    out.push_back(emit_qkv_rope_chain(qc, {"qkv_rope_decode, natural K order"}));
  }
  rd.chain = wg_splitk(d, rd.experts);
  REQUIRE(norm_router_topk_chain_fits(d, rd));
  out.push_back(
      emit_norm_router_topk_chain(d, rd, c.rms_norm_eps, true, {"router, canonical order"}));
  rd.chain = 1;
  rd.chain_natural = true;
  REQUIRE(norm_router_topk_chain_fits(d, rd));
  out.push_back(
      emit_norm_router_topk_chain(d, rd, c.rms_norm_eps, true, {"router, natural K order"}));
  return out;
}

void compile_all(const std::filesystem::path& config) {
  const models::ModelConfig c = models::ModelConfig::load(config);
  runtime::CompileOptions opts;
  opts.arch = "sm_90";
  opts.headers = kernel_headers();
  for (const KernelSource& k : model_kernels(c)) {
    INFO(k.name << "\n" << k.source);
    CHECK(k.source.find("extern \"C\" __global__") != std::string::npos);
    const runtime::CompileResult r = runtime::compile_cuda(k.source, k.name, opts);
    CHECK(!r.cubin.empty());
    CHECK(r.log.empty()); // warnings are bugs
  }
}

} // namespace

TEST_CASE("decode kernels compile for the tiny model") {
  compile_all(testing::source_dir() / "examples/tiny/config.json");
}

TEST_CASE("decode kernels compile for gpt-oss-20b") {
  XSERV_REQUIRE_DATA(data);
  const auto config = data / "gpt-oss-20b/config.json";
  if (!std::filesystem::exists(config)) {
    MESSAGE("skipped: " << config << " not found");
    return;
  }
  compile_all(config);
}

TEST_CASE("decode kernels compile for gpt-oss-120b") {
  compile_all(testing::source_dir() / "examples/gpt-oss-120b/config.json");
}

TEST_CASE("decode tuning variants and the clustered router compile for sm_90, bad knobs refused") {
  runtime::CompileOptions opts;
  opts.arch = "sm_90";
  opts.headers = kernel_headers();
  std::vector<KernelSource> ks;
  LinearDims o{4096, 2880, false, true, true};
  o.max_tokens = 1;
  o.unroll = 8;
  o.ksplit = 4;
  ks.push_back(emit_linear(o, {}));
  CHECK(ks.back().name == "linear_residual_k4096_n2880_t1_u8_s4");
  CHECK(ks.back().launch.blocks_x == 2880 / (8 / 4 * 2)); // two rows per group of 4 warps
  LinearDims os = o;
  os.smem = true;
  CHECK(linear_smem_rows(os) == 24); // 120 blocks of 192 KiB: 16 rows would take 180 SMs
  ks.push_back(emit_linear(os, {}));
  CHECK(ks.back().name == "linear_residual_k4096_n2880_t1_smem_r24");
  CHECK(ks.back().launch.blocks_x == 120);
  CHECK(ks.back().launch.smem(1) == 24 * 4096 * 2);
  os.max_tokens = 2;
  CHECK(linear_smem_rows(os) == 0);
  QkvDims q{2880, 4096, 512, 512};
  q.rows = 1;
  q.ksplit = 2;
  REQUIRE(qkv_decode_fits(q));
  ks.push_back(emit_qkv_decode(q, {}));
  CHECK(ks.back().launch.blocks_x == 5120 / 4);
  for (int experts : {8, 32, 128}) {
    ks.push_back(emit_norm_router_topk(2880, {experts, 4}, 1e-5, true, {}));
    CHECK(ks.back().launch.cluster_x == router_cluster_blocks(experts));
    const std::string attr =
        "XSERV_CLUSTER_X(" + std::to_string(router_cluster_blocks(experts)) + ")";
    CHECK(ks.back().source.find(attr) != std::string::npos);
  }
  CHECK(router_cluster_blocks(32) == 8);
  CHECK(router_ksplit(32) == 4); // 2 pairs a block, 4 warps each
  CHECK(router_cluster_blocks(128) == 8);
  CHECK(router_ksplit(128) == 1); // 8 pairs a block: a warp each
  CHECK(router_cluster_blocks(8) == 4);
  CHECK(router_ksplit(8) == 8);
  MoeDims m{2880, 2880, 32, 4, true};
  m.min_blocks = 5;
  ks.push_back(emit_moe_gate_up(m, {}));
  CHECK(ks.back().source.find("__launch_bounds__(256, 5)") != std::string::npos);
  AttentionDims att{64, 8, 64, 16, 512, 128, 0.125, true};
  att.chunk = 128;
  CHECK(emit_attention_decode_mma(att, {}).launch.block == 128); // 4 warps: the lowering's
  for (int warps : {1, 2}) {
    att.decode_warps = warps;
    ks.push_back(emit_attention_decode_mma(att, {}));
    CHECK(ks.back().name == "attention_decode_mma_h64_g8_d64_b16_m512_w128_c128_wp" +
                                std::to_string(warps) + "_kvf32");
    CHECK(ks.back().launch.block == 32 * warps);
  }
  for (const KernelSource& k : ks) {
    INFO(k.name);
    const runtime::CompileResult r = runtime::compile_cuda(k.source, k.name, opts);
    CHECK(!r.cubin.empty());
    CHECK(r.log.empty());
  }
  o.ksplit = 3;
  CHECK_THROWS_WITH(emit_linear(o, {}), doctest::Contains("K splits 3"));
  q.ksplit = 16;
  CHECK(!qkv_decode_fits(q));
  q.ksplit = 4;
  q.rows = 0; // 8 / 4 * 2 = 4 rows a block: fits 4096 / 512 / 512
  CHECK(qkv_decode_fits(q));
  q.nk = q.nv = 510;
  CHECK(!qkv_decode_fits(q));
  CHECK_THROWS_WITH(emit_qkv_decode(q, {}), doctest::Contains("multiples of a block's rows"));
  att.decode_warps = 3; // 4 pairs of output tiles do not split 3 ways
  CHECK_THROWS_WITH(emit_attention_decode_mma(att, {}), doctest::Contains("3 warps must divide"));
  // Block 0 gathers one logit per thread: the lowering keeps larger routers unfused.
  CHECK_THROWS_WITH(emit_norm_router_topk(2880, {384, 4}, 1e-5, true, {}),
                    doctest::Contains("at most 256 experts"));
}

TEST_CASE("canonical plans' fused decode kernels: launch rules, and shapes they refuse") {
  // The 20b's qkv: blocks of two 16-row groups (rotation pairs of one head), 5 warps a group
  // (q's 5 K ranges, k's and v's 9 two a warp), a ring of 4 at one token, of 2 at 8 (two blocks
  // an SM).
  QkvDims q{2880, 4096, 512, 512};
  q.round_act = true;
  q.head_dim = 64;
  q.block = 16;
  q.table = 512;
  q.attention_factor = 1.3465735902799727;
  q.chain_q = wg_splitk(2880, 4096);
  q.chain_kv = wg_splitk(2880, 512);
  CHECK(q.chain_q == 5);
  CHECK(q.chain_kv == 9);
  q.max_tokens = 1;
  REQUIRE(qkv_chain_fits(q));
  KernelSource k1 = emit_qkv_rope_chain(q, {});
  CHECK(k1.name ==
        "qkv_rope_decode_chain_k2880_q4096_k512_v512_t1_c5x9_g2_w5_r4_d64_b16_m512_kvbf16");
  CHECK(k1.launch.block == 320);
  CHECK(k1.launch.blocks_x == 5120 / 32);
  CHECK(k1.launch.smem(1) == 10 * 4 * 2048 + 1444 * 4);
  q.max_tokens = 8;
  CHECK(emit_qkv_rope_chain(q, {}).name.find("_t8_c5x9_g2_w5_r2_") != std::string::npos);
  // Refused: ranges that are not whole tiles, fp32 activations, k and v of other widths.
  QkvDims bad = q;
  bad.chain_q = 2;
  CHECK_FALSE(qkv_chain_fits(bad));
  CHECK_THROWS_WITH(emit_qkv_rope_chain(bad, {}), doctest::Contains("K ranges dividing K / 64"));
  bad = q;
  bad.round_act = false;
  CHECK_FALSE(qkv_chain_fits(bad));
  bad = q;
  bad.nv = 1024;
  CHECK_FALSE(qkv_chain_fits(bad));
  // The router: 2 row groups x 9 ranges = 18 chains over a cluster of 3 blocks; the 120b's
  // 8 x 9 over 8 blocks (a group's ranges in turn); the tiny model's 8 experts, half a group.
  RouterTopKDims r{32, 4, true};
  r.chain = wg_splitk(2880, 32);
  REQUIRE(norm_router_topk_chain_fits(2880, r));
  const KernelSource rk = emit_norm_router_topk_chain(2880, r, 1e-5, true, {});
  CHECK(rk.name == "rmsnorm_router_topk_chain_d2880_e32_k4_c9");
  CHECK(rk.launch.blocks_x == 3);
  CHECK(rk.launch.cluster_x == 3);
  r.experts = 128;
  CHECK(emit_norm_router_topk_chain(2880, r, 1e-5, true, {}).launch.blocks_x == 8);
  r.experts = 8;
  r.chain = 1;
  CHECK(norm_router_topk_chain_fits(64, r));
  r.experts = 12; // not whole 8-row halves
  CHECK_FALSE(norm_router_topk_chain_fits(64, r));
  r.experts = 32;
  r.chain = 2; // 45 tiles in 2 ranges
  CHECK_FALSE(norm_router_topk_chain_fits(2880, r));
  CHECK_THROWS_WITH(emit_norm_router_topk_chain(2880, r, 1e-5, true, {}),
                    doctest::Contains("2 ranges"));
  // The natural K order: one chain a row group, one block (two active warps, rings of 16).
  r.chain = 1;
  r.chain_natural = true;
  REQUIRE(norm_router_topk_chain_fits(2880, r));
  const KernelSource rn = emit_norm_router_topk_chain(2880, r, 1e-5, true, {});
  CHECK(rn.name == "rmsnorm_router_topk_chain_d2880_e32_k4_c1_natural");
  CHECK(rn.launch.blocks_x == 1);
  CHECK(rn.launch.smem(1) == 2 * 16 * 2048);
  r.experts = 128; // the 120b's 8 row groups: 8 rings of 10 within 160 KB
  REQUIRE(norm_router_topk_chain_fits(2880, r));
  CHECK(emit_norm_router_topk_chain(2880, r, 1e-5, true, {}).launch.smem(1) == 8 * 10 * 2048);
  r.experts = 32;
  r.chain = 9; // the natural order has no K ranges
  CHECK_FALSE(norm_router_topk_chain_fits(2880, r));
  // qkv in the natural order: a warp a group (one chain over K), the ring as deep as two
  // blocks an SM allow (12 at one token, 8 at 8 tokens).
  QkvDims qn = q;
  qn.chain_q = qn.chain_kv = 1;
  qn.chain_natural = true;
  qn.max_tokens = 1;
  REQUIRE(qkv_chain_fits(qn));
  const KernelSource kn = emit_qkv_rope_chain(qn, {});
  CHECK(
      kn.name ==
      "qkv_rope_decode_chain_k2880_q4096_k512_v512_t1_c1x1_g2_w1_r12_d64_b16_m512_kvbf16_natural");
  CHECK(kn.launch.block == 64);
  CHECK(kn.launch.blocks_x == 5120 / 32);
  qn.max_tokens = 8;
  CHECK(emit_qkv_rope_chain(qn, {}).name.find("_t8_c1x1_g2_w1_r12_") != std::string::npos);
  qn.chain_q = 5; // K ranges are the slot order's
  CHECK_FALSE(qkv_chain_fits(qn));
  CHECK_THROWS_WITH(emit_qkv_rope_chain(qn, {}), doctest::Contains("one each in the natural"));
}

TEST_CASE("tensor-core decode kernels: launch rules, ring sizes, and shapes they refuse") {
  // The 20b's MoE rows: gate_up 4 groups of 8 pairs x 2 K splits, down 2 groups of 16 rows x 4.
  MoeDims m{2880, 2880, 32, 4, false};
  m.mxfp4 = true;
  m.round_act = true;
  m.mma = true;
  m.mma_stages = 2;
  REQUIRE(moe_mma_fits(m));
  const KernelSource gu = emit_moe_gate_up(m, {}), dn = emit_moe_down_part(m, {});
  CHECK(gu.name == "moe_gate_up_e32_k4_d2880_i2880_mx4_a16_mma_g4_s2_c8_t2");
  CHECK(gu.launch.block == 256);
  CHECK(gu.launch.blocks_x == 2880 / 32);
  // A 2-chunk ring of 2 KB a warp, then its scale factors: 16 bytes a block pair and MMA row
  // pair of the warp's 46-block K split.
  CHECK(gu.launch.smem(1) == 8 * (2 * 2048 + 46 / 2 * 8 * 16));
  CHECK(dn.launch.smem(1) == 8 * (2 * 2048 + 24 / 2 * 8 * 16)); // 4 splits of 24 blocks
  CHECK(gu.source.find("moe_gate_up_mx4_mma<2880, 2880, 32, 4, 4, 2, 8, 2, false>") !=
        std::string::npos);
  CHECK(dn.name == "moe_down_part_e32_k4_d2880_i2880_mx4_a16_mma_g2_s4_c8_t2");
  CHECK(dn.launch.blocks_x == 2880 / 32);
  CHECK(dn.launch.y_per_token == 4);
  // The canonical order (compile --gemm-order canonical): one chain over all of K
  // (moe_chain_splits; mma_splits, a benchmark's, sets whole-tile ranges), twice the row groups
  // a block where they divide the rows, each warp's ring then its 16 rows' scale bytes (24 words
  // a row: 90 bytes from the aligned word holding the first).
  CHECK(moe_chain_splits(2880) == 1);
  CHECK(moe_chain_splits(256) == 1);
  MoeDims c = m;
  c.mma_chain = true;
  c.mma_splits = 2; // 45 tiles in 2 ranges: not whole tiles
  CHECK_FALSE(moe_mma_fits(c));
  c.mma_splits = 5;
  REQUIRE(moe_mma_fits(c));
  CHECK(emit_moe_down_part(c, {}).name.find("_g2_s5_") != std::string::npos);
  c.mma_splits = 0;
  REQUIRE(moe_mma_fits(c));
  const KernelSource cgu = emit_moe_gate_up(c, {}), cdn = emit_moe_down_part(c, {});
  CHECK(cgu.name == "moe_gate_up_e32_k4_d2880_i2880_mx4_a16_mma_g8_s1_c8_t2_chain");
  CHECK(cgu.launch.block == 256);
  CHECK(cgu.launch.blocks_x == 2880 / 64);
  CHECK(cgu.launch.smem(1) == 8 * (2 * 2048 + 16 * 4 * 24));
  CHECK(cgu.source.find("moe_gate_up_mx4_mma<2880, 2880, 32, 4, 8, 1, 8, 2, true>") !=
        std::string::npos);
  CHECK(cdn.name == "moe_down_part_e32_k4_d2880_i2880_mx4_a16_mma_g4_s1_c8_t2_chain");
  CHECK(cdn.launch.block == 128);
  CHECK(cdn.launch.smem(1) == 4 * (2 * 2048 + 16 * 4 * 24));
  // ... and with the tokens as columns: the same rings, then a staged row a token (2 bytes a
  // value, gemm_act's slots)
  MoeDims cc = c;
  cc.mma_cols = true;
  REQUIRE(moe_cols_fits(cc));
  const KernelSource ccg = emit_moe_gate_up(cc, {});
  CHECK(ccg.name == "moe_gate_up_e32_k4_d2880_i2880_mx4_a16_mma_g8_s1_c8_t2_cols_chain");
  CHECK(ccg.launch.smem(8) == cgu.launch.smem(1) + 8 * 2880 * 2);
  CHECK(ccg.source.find("moe_gate_up_mx4_cols<2880, 2880, 32, 4, 8, 1, 8, 2, true>") !=
        std::string::npos);
  c.mma_stages = 0; // ... through the ring only
  CHECK_FALSE(moe_mma_fits(c));
  CHECK_THROWS_WITH(emit_moe_gate_up(c, {}), doctest::Contains("canonical order"));
  // A small model's ring is no deeper than a split's chunks need (2 blocks a row: 1 chunk).
  MoeDims tiny{64, 64, 8, 2, false};
  tiny.mxfp4 = tiny.round_act = tiny.mma = true;
  tiny.mma_stages = 4;
  CHECK(emit_moe_gate_up(tiny, {}).launch.smem(1) == 8 * (2 * 2048 + 128));
  // Split (fp32-grade) activations, BF16 experts, K not a multiple of 64 for the ring, or row
  // groups that do not divide the rows: not on tensor cores; asked anyway, a clear error.
  MoeDims bad = m;
  bad.round_act = false;
  CHECK_FALSE(moe_mma_fits(bad));
  CHECK_THROWS_WITH(emit_moe_gate_up(bad, {}), doctest::Contains("tensor-core MoE gate_up"));
  bad = m;
  bad.mxfp4 = false;
  CHECK_FALSE(moe_mma_fits(bad));
  bad = m;
  bad.hidden = bad.inter = 96; // 3 blocks a row: registers only
  CHECK_FALSE(moe_mma_kernel_fits(bad, true));
  bad.mma_stages = 0;
  bad.mma_groups = 2;
  CHECK(moe_mma_fits(bad));
  bad = m;
  bad.mma_groups = 8; // 128-row groups do not divide the 2880 down rows
  CHECK(moe_mma_kernel_fits(bad, true));
  CHECK_FALSE(moe_mma_kernel_fits(bad, false));
  CHECK_THROWS_WITH(emit_moe_down_part(bad, {}), doctest::Contains("tensor-core MoE down"));
  // o_proj of 2-8 token steps: the tokens in the MMA's columns, their activations after the rings.
  LinearDims o{4096, 2880, false, true, true};
  o.round_act = true;
  o.mma = true;
  REQUIRE(linear_mma_fits(o));
  const KernelSource lo = emit_linear(o, {});
  CHECK(lo.name == "linear_residual_k4096_n2880_t8_mma_g2_s8_r4_a16");
  CHECK(lo.launch.block == 512);
  CHECK(lo.launch.blocks_x == 2880 / 32);
  CHECK(lo.launch.smem(3) == 16 * 4 * 2048 + 3 * (4096 / 2 + 4) * 4);
  o.norm = true; // qkv's norm is not in the tensor-core kernel
  CHECK_FALSE(linear_mma_fits(o));
  CHECK_THROWS_WITH(emit_linear(o, {}), doctest::Contains("tensor-core linear"));
  o.norm = false;
  // One chain over natural K (mma_natural): its name and template argument; one K order only,
  // and only on tensor cores.
  LinearDims on = o;
  on.mma_natural = true;
  on.mma_splits = 1;
  on.mma_groups = 4;
  on.mma_stages = 8;
  REQUIRE(linear_mma_fits(on));
  const KernelSource ln = emit_linear(on, {});
  CHECK(ln.name == "linear_residual_k4096_n2880_t8_mma_g4_s1_r8_a16_natural");
  CHECK(ln.source.find("linear_decode_mma<4096, 2880, 8, 4, 1, 8, true, true, false, true>") !=
        std::string::npos);
  on.mma_chain = true;
  CHECK_FALSE(linear_mma_fits(on));
  on.mma_chain = on.mma = false;
  CHECK_THROWS_WITH(emit_linear(on, {}), doctest::Contains("natural K order"));
  o.k = 2880 + 32;
  CHECK_FALSE(linear_mma_fits(o));
}

TEST_CASE("kernel names and sources are deterministic and headed by their IR") {
  LinearDims d{2880, 5120, true, true, false, 1e-5};
  const KernelSource a = emit_linear(d, {"%13 = rms_norm_linear(%11, %1, %2, %3) {eps=1e-05}"});
  const KernelSource b = emit_linear(d, {"%13 = rms_norm_linear(%11, %1, %2, %3) {eps=1e-05}"});
  CHECK(a.name == "rmsnorm_linear_k2880_n5120");
  CHECK(a.source == b.source);
  CHECK(a.source.rfind("// kernel: rmsnorm_linear_k2880_n5120\n// %13 = rms_norm_linear", 0) == 0);
  CHECK(a.source.find("linear_decode<2880, 5120, 8, 2, true, true, false, false, 4, 1>") !=
        std::string::npos);
  CHECK(a.launch.grid(1)[0] == 320);
  CHECK(a.launch.smem(4) == 4 * 2880 * 4);
  d.norm = false;
  d.residual = true;
  CHECK(emit_linear(d, {}).name == "linear_residual_k2880_n5120");
  d.bias = false;
  CHECK(emit_linear(d, {}).name == "linear_residual_k2880_n5120_nobias");
  CHECK(emit_attention_decode({64, 8, 64, 16, 512, 128, 0.125}, {}).name ==
        "attention_decode_h64_g8_d64_b16_m512_w128");
  CHECK(emit_moe_down({2880, 2880, 32, 4, true}, {}).name ==
        "moe_down_residual_e32_k4_d2880_i2880");
  CHECK(attention_splits(1) == 1);
  CHECK(attention_splits(1000) == 16);
}

TEST_CASE("gemm_splitk fills the GPU for few rows in the fewest waves x K tiles") {
  using xserv::codegen::gemm_splitk;
  CHECK(gemm_splitk(2880, 4096) == 5);   // 32 N tiles x 5 = 160 blocks: one wave of 9 K tiles
  CHECK(gemm_splitk(2880, 512) == 9);    // 4 N tiles: as far as 4 K tiles per block allow
  CHECK(gemm_splitk(4096, 2880) == 8);   // 23 N tiles x 8: one wave of 8 (16: two waves of 4)
  CHECK(gemm_splitk(2880, 201088) == 1); // the lm_head's 1571 N tiles fill the GPU alone
  CHECK(gemm_splitk(128, 128) == 1);     // 2 K tiles: nothing to split
  for (int k : {64, 2880, 4096})
    for (int n : {32, 512, 2880, 4096}) {
      const int s = gemm_splitk(k, n);
      CHECK((k / 64) % s == 0);
      CHECK((s == 1 || k / 64 / s >= 4));
    }
}

TEST_CASE("gemm emitter: names, launch rules and refusals") {
  GemmDims d;
  d.k = 2880;
  d.n = 5120;
  d.norm = true;
  const KernelSource dense = emit_gemm(d, {"qkv"});
  CHECK(dense.name == "gemm_store_norm_k2880_n5120_m64_x2");
  CHECK(dense.launch.grid(300) == std::array<unsigned, 3>{40, 5, 1}); // ceil(300 / 64) row tiles
  CHECK(dense.launch.smem(300) == dense.launch.smem(9)); // fixed: the pipeline's stages
  CHECK(dense.launch.smem(1) > 48 * 1024);               // needs the opt-in, as Module does
  CHECK(dense.source == emit_gemm(d, {"qkv"}).source);   // deterministic

  d.splitk = gemm_splitk(d.k, d.n);
  d.bm = 32;
  const KernelSource split = emit_gemm(d, {"qkv"});
  CHECK(split.name.ends_with("_m32_x2_splitk5")); // 40 N tiles x 5: one wave of 9 K tiles
  // The rule's arithmetic at 40 rows (two 32-row tiles; the lowering takes a 64-row tile there).
  CHECK(split.launch.grid(40) == std::array<unsigned, 3>{40, 2, 5});
  // Every row tile's pipeline is 110.6 KB (gemm.cuh's gemm_stages x tile bytes): 2 blocks per SM,
  // which gemm_splitk's cost model counts on.
  CHECK(split.launch.smem(1) == 110592);
  CHECK(dense.launch.smem(1) == 110592);
  // The reduce spreads N over blocks of 256 threads, a row of blocks per token.
  const KernelSource reduce = emit_gemm_splitk_reduce(5120, 5, true, false, {});
  CHECK(reduce.launch.grid(3) == std::array<unsigned, 3>{20, 3, 1});

  GemmDims g; // the 20b gate_up, grouped over 32 experts, top-4
  g.k = 2880;
  g.n = 5760;
  g.grouped = g.gather = true;
  g.experts = 32;
  g.ksel = 4;
  g.bm = 128;
  g.epilogue = GemmEpilogue::Swiglu;
  const KernelSource grouped = emit_gemm(g, {"gate_up"});
  CHECK(grouped.name == "gemm_swiglu_k2880_n5760_m128_e32_k4_gather_x2");
  // Row tiles: ceil(512 * 4 / 128) full tiles plus one partial tile per expert at most.
  CHECK(grouped.launch.grid(512) == std::array<unsigned, 3>{45, 16 + 32, 1});
  CHECK(moe_tiles_ints(2048, 32, 128) == 1 + 3 * (16 + 32));

  GemmDims bad = d;
  bad.k = 2848; // not a multiple of the 64-wide K tile
  CHECK_THROWS_WITH(emit_gemm(bad, {}), doctest::Contains("K divisible by 64"));
  bad = d;
  bad.splitk = 4; // 45 K tiles
  CHECK_THROWS_WITH(emit_gemm(bad, {}), doctest::Contains("split K 4 must divide the 45 K tiles"));
  bad = g;
  bad.grouped = false;
  CHECK_THROWS_WITH(emit_gemm(bad, {}), doctest::Contains("gathering gemm must be grouped"));
  bad = d;
  bad.bm = 48;
  CHECK_THROWS_WITH(emit_gemm(bad, {}), doctest::Contains("tile rows must be 32, 64 or 128"));
  CHECK(gemm_fits(2880));
  CHECK(!gemm_fits(2848));
}

TEST_CASE("prefill kernels compile for gpt-oss-20b: gemms, MoE sort and combine, split-K reduce, "
          "sampling") {
  runtime::CompileOptions opts;
  opts.arch = "sm_90";
  opts.headers = kernel_headers();
  GemmDims d;
  d.k = 2880;
  d.n = 512;
  d.norm = true;
  d.bm = 32;
  d.splitk = gemm_splitk(d.k, d.n);
  GemmDims g;
  g.k = 2880;
  g.n = 2880;
  g.grouped = true;
  g.experts = 32;
  g.ksel = 4;
  g.epilogue = GemmEpilogue::Scatter;
  g.split = false;
  GemmDims gm = g; // MXFP4 experts, both epilogues, every tile height
  gm.mxfp4 = true;
  std::vector<KernelSource> mx;
  for (int bm : {32, 64, 128})
    for (GemmEpilogue epi : {GemmEpilogue::Scatter, GemmEpilogue::Swiglu}) {
      gm.bm = bm;
      gm.epilogue = epi;
      gm.gather = epi == GemmEpilogue::Swiglu;
      gm.n = epi == GemmEpilogue::Swiglu ? 5760 : 2880;
      gm.split = bm != 64;
      mx.push_back(emit_gemm(gm, {}));
    }
  CHECK(mx[0].name.find("_mx4") != std::string::npos);
  for (const KernelSource& k : mx) {
    INFO(k.name);
    const runtime::CompileResult r = runtime::compile_cuda(k.source, k.name, opts);
    CHECK(!r.cubin.empty());
    CHECK_MESSAGE(r.log.empty(), r.log);
  }
  for (const KernelSource& k :
       {emit_gemm(d, {}), emit_gemm(g, {}), emit_gemm_splitk_reduce(512, d.splitk, true, false, {}),
        emit_moe_sort({32, 4, 64, 4096}, {}), emit_moe_combine(2880, 4, true, {}),
        emit_row_inv_rms(2880, 1e-5, {}), emit_argmax(201088, {}), emit_argmax_masked(201088, {}),
        emit_argmax_masked(1001, {})}) {
    INFO(k.name);
    const runtime::CompileResult r = runtime::compile_cuda(k.source, k.name, opts);
    CHECK(!r.cubin.empty());
    CHECK(r.log.empty());
  }
}

TEST_CASE("gemm_wg in the natural K order compiles for sm_90 and refuses MXFP4 weights") {
  runtime::CompileOptions opts;
  opts.arch = "sm_90";
  opts.headers = kernel_headers();
  GemmWgDims d;
  d.k = 2880;
  d.n = 5120;
  d.bn = 128;
  d.wm = 2;
  d.stages = 3;
  d.natural = true;
  const KernelSource k = emit_gemm_wg(d, {});
  CHECK(k.name.ends_with("_natural"));
  CHECK(k.source.find(", false, true>(") != std::string::npos); // SMALL off, NATURAL on
  const runtime::CompileResult r = runtime::compile_cuda(k.source, k.name, opts);
  CHECK(!r.cubin.empty());
  CHECK_MESSAGE(r.log.empty(), r.log);
  // The small token tiles of decode-sized steps (decode_mma_bench times them at 1 and 8 tokens).
  for (int bn : {8, 16}) {
    GemmWgDims s = d;
    s.n = 2880;
    s.k = 4096;
    s.bn = bn;
    s.wm = 1;
    s.stages = 8;
    s.bias = true;
    CAPTURE(bn);
    REQUIRE(gemm_wg_fits(s));
    const KernelSource ks = emit_gemm_wg(s, {});
    const runtime::CompileResult rs = runtime::compile_cuda(ks.source, ks.name, opts);
    CHECK(!rs.cubin.empty());
    CHECK_MESSAGE(rs.log.empty(), rs.log);
  }
  d.mxfp4 = true;
  CHECK_FALSE(gemm_wg_fits(d));
  CHECK_THROWS_WITH(emit_gemm_wg(d, {}), doctest::Contains("gemm_wg cannot take"));
}

TEST_CASE("gemm_wg's grouped MXFP4 tiles of 8 tokens compile for sm_90") {
  // The canonical order's MoE at decode sizes on wgmma (decode_mma_bench times them at 1 and 8
  // tokens): gate_up (gathered, swiglu) and down (scattered), one m64 tile a block.
  runtime::CompileOptions opts;
  opts.arch = "sm_90";
  opts.headers = kernel_headers();
  for (bool gate_up : {true, false}) {
    GemmWgDims g;
    g.grouped = true;
    g.experts = 32;
    g.ksel = 4;
    g.bn = 8;
    g.wm = 1;
    g.stages = 8;
    g.mxfp4 = g.small_scales = true;
    g.k = 2880;
    g.n = gate_up ? 5760 : 2880;
    g.gather = gate_up;
    g.epilogue = gate_up ? GemmEpilogue::Swiglu : GemmEpilogue::Scatter;
    CAPTURE(gate_up);
    REQUIRE(gemm_wg_fits(g));
    const KernelSource k = emit_gemm_wg(g, {});
    const runtime::CompileResult r = runtime::compile_cuda(k.source, k.name, opts);
    CHECK(!r.cubin.empty());
    CHECK_MESSAGE(r.log.empty(), r.log);
  }
}
