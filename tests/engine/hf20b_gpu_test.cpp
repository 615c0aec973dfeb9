// The full-size synthetic gpt-oss-20b through CudaModel against HF transformers' own BF16 and
// fp32 runs (made by tools/hf_20b_reference.py; scripts/device/hf20b.sh runs both on the GPU).
//
// Gates (never loosened to pass), for split (fp32-grade) and plain bf16 gemm activations: for a
// 256-token random prompt, at every position xserv's relative L2 to HF fp32 must be <= 0.014
// (split; bf16: 0.6) x HF BF16's own relative L2 to HF fp32 and <= 3e-4 (bf16: 1.5e-2) outright
// (see kRatio; a bf16 KV cache: 1.0 x, kRatioKvBf16); greedy decoding of 64 tokens must equal
// HF BF16's up to the first step where HF BF16's top-2 margin is below 0.05.
// Also reported: how many greedy steps xserv (and HF BF16) share with HF fp32.
//
// Needs XSERV_20B_CKPT (the checkpoint, `xserv synth --config gpt-oss-20b.json --seed 0`) and
// XSERV_20B_REF (the reference directory); skips with a message without them or without a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "models/config.h"
#include "models/gpt_oss.h"
#include "runtime/device.h"
#include "tests/compiled_model.h"
#include "tests/step_input.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
namespace engine = xserv::engine;
namespace models = xserv::models;
using json = nlohmann::json;

// Split (fp32-grade) gemm activations: 10x the measured worst, ratio xserv / HF BF16 0.0014, max
// rel L2 to HF fp32 3.019e-5 (H200, 2026-11-29, docs/PERF.md "the 20b against HF"). A 1.25 x
// BF16 gate let errors ~900x the measured one through.
constexpr double kRatio = 0.014;
constexpr double kMaxErr = 3e-4;
// Plain bf16 gemm activations (compile's default): every matmul input rounds
// once, a systematic error, not noise: measured ratio median 0.383, worst 0.439, max 9.43e-3
// (H200, 2026-12-01, docs/PERF.md, "Fidelity against HF transformers"); gated at ~1.4x and ~1.6x of
// that.
constexpr double kRatioBf16 = 0.6;
constexpr double kMaxErrBf16 = 1.5e-2;
// A bf16 KV cache (--kv-dtype bf16) rounds every key and value as HF BF16's own cache does: held
// to parity with HF BF16 at every position (ratio 1) under the bf16 outright bound. Measured on
// the 120b's config cut to 4 layers (H100, 2026-12-06): ratio worst 0.65, max 9.55e-3, against
// 0.48 and 8.04e-3 with the f32 cache (docs/PERF.md, "Fidelity against HF transformers").
constexpr double kRatioKvBf16 = 1.0;
constexpr double kMarginFloor = 0.05;

json read_json(const fs::path& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot read " << path);
  return json::parse(in);
}

std::vector<int32_t> read_ids(const fs::path& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot read " << path);
  std::vector<int32_t> ids;
  for (int64_t v; in >> v;)
    ids.push_back(static_cast<int32_t>(v));
  return ids;
}

/// Raw float32 rows of `cols` values each.
std::vector<std::vector<float>> read_rows(const fs::path& path, size_t rows, size_t cols) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read " << path);
  REQUIRE_MESSAGE(fs::file_size(path) == rows * cols * sizeof(float),
                  path << " holds " << fs::file_size(path) << " bytes, not " << rows << " x "
                       << cols << " floats");
  std::vector<std::vector<float>> out(rows, std::vector<float>(cols));
  for (auto& r : out)
    in.read(reinterpret_cast<char*>(r.data()), static_cast<std::streamsize>(cols * sizeof(float)));
  REQUIRE(in.good());
  return out;
}

using xserv::testing::rel_l2; // tests/test_util.h

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

size_t shared_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i])
    ++i;
  return i;
}

} // namespace

TEST_CASE("gpu: synthetic 20b against HF transformers") {
  const char* ckpt_env = std::getenv("XSERV_20B_CKPT");
  const char* ref_env = std::getenv("XSERV_20B_REF");
  if (!ckpt_env || !*ckpt_env || !ref_env || !*ref_env) {
    MESSAGE("skipped: set XSERV_20B_CKPT (synthetic 20b checkpoint) and XSERV_20B_REF "
            "(tools/hf_20b_reference.py output); scripts/device/hf20b.sh does both");
    return;
  }
  if (const xserv::runtime::DeviceInfo dev = xserv::runtime::probe_device(); !dev.available) {
    MESSAGE("skipped: no GPU (" << dev.reason << ")");
    return;
  }
  const fs::path ckpt = ckpt_env, ref = ref_env;
  const auto ids = read_ids(ref / "ids.txt");
  const json g16 = read_json(ref / "hf_bf16_greedy.json");
  const json g32 = read_json(ref / "hf_fp32_greedy.json");
  const auto bf16_greedy = g16.at("greedy").get<std::vector<int32_t>>();
  const auto bf16_margin = g16.at("margin").get<std::vector<double>>();
  const auto fp32_greedy = g32.at("greedy").get<std::vector<int32_t>>();
  REQUIRE(!ids.empty());
  REQUIRE(bf16_greedy.size() == bf16_margin.size());
  REQUIRE(bf16_greedy.size() == fp32_greedy.size());
  const size_t T = ids.size(), G = bf16_greedy.size();

  const auto config = models::ModelConfig::load(ckpt / "config.json");
  const auto V = static_cast<size_t>(config.vocab_size);
  const auto f32 = read_rows(ref / "hf_fp32_logits.f32", T, V);
  std::vector<double> bf16_err(T);
  {
    const auto bf16 = read_rows(ref / "hf_bf16_logits.f32", T, V);
    for (size_t p = 0; p < T; ++p)
      bf16_err[p] = rel_l2(bf16[p], f32[p]);
  }

  const xserv::ir::Graph all = models::build_gpt_oss(config, {.last_logits_only = false});
  const xserv::ir::Graph all_kv_bf16 = models::build_gpt_oss(
      config, {.last_logits_only = false, .kv_dtype = xserv::ir::DType::BF16});
  // Split gemms, plain bf16 ones, plain bf16 ones in the gemms' canonical order (compile
  // --gemm-order canonical: the same roundings, sums in another order; --gemm-order natural:
  // the dense linears in cuBLAS's K order, pinned) and plain bf16 ones over a bf16 KV cache
  // (--kv-dtype bf16: keys and values rounded as HF's bf16 cache holds them); all but split held
  // to the bf16 gates (the bf16 cache to its own ratio).
  for (const char* mode : {"split", "bf16", "bf16, canonical order", "bf16, natural order",
                           "bf16, bf16 KV cache"}) {
    CAPTURE(mode);
    const bool split = mode == std::string_view("split");
    const bool kv_bf16 = mode == std::string_view("bf16, bf16 KV cache");
    const double ratio_gate = split ? kRatio : kv_bf16 ? kRatioKvBf16 : kRatioBf16;
    const double max_gate = split ? kMaxErr : kMaxErrBf16;
    xserv::testing::GraphModelOptions opts = xserv::testing::quiet();
    opts.quiet = true;
    opts.gemm_split = split;
    const bool natural = mode == std::string_view("bf16, natural order");
    opts.gemm_canonical = natural || mode == std::string_view("bf16, canonical order");
    opts.gemm_natural = opts.dense_cublas = natural;
    const auto engine_model = xserv::testing::graph_cuda_model(
        ckpt, 1, static_cast<int64_t>(T + G + 8), kv_bf16 ? &all_kv_bf16 : &all, opts);
    engine::CudaModel& engine = *engine_model;

    // 1. Teacher-forced: one step of all T tokens (sub-steps through the cache).
    std::vector<double> err(T), ratio(T);
    {
      const auto rows =
          engine.step_all(xserv::testing::make_step({ids}, {0}, {0}, engine.kv_geometry()));
      REQUIRE(rows.size() == T);
      for (size_t p = 0; p < T; ++p) {
        err[p] = rel_l2(rows[p], f32[p]);
        ratio[p] = err[p] / bf16_err[p];
      }
    }
    size_t worst = 0, over = 0;
    std::string failing;
    for (size_t p = 0; p < T; ++p) {
      const auto key = [&](size_t i) { return std::isnan(ratio[i]) ? INFINITY : ratio[i]; };
      if (key(p) > key(worst))
        worst = p;
      if (!(ratio[p] <= ratio_gate)) {
        ++over;
        if (over <= 12)
          failing += fmt::format(" {}:{:.3g}/{:.3g}={:.2f}", p, err[p], bf16_err[p], ratio[p]);
      }
    }
    MESSAGE(fmt::format("20b teacher-forced ({} gemms), {} positions: rel L2 vs HF fp32: xserv "
                        "median {:.4g} "
                        "max {:.4g}; HF bf16 median {:.4g} max {:.4g}; ratio median {:.3f}, worst "
                        "{:.3f} at position {} ({:.4g} vs {:.4g}); {} positions over {}",
                        mode, T, median(err), *std::max_element(err.begin(), err.end()),
                        median(bf16_err), *std::max_element(bf16_err.begin(), bf16_err.end()),
                        median(ratio), ratio[worst], worst, err[worst], bf16_err[worst], over,
                        ratio_gate));
    CHECK_MESSAGE(over == 0, over << " positions over " << ratio_gate
                                  << " x HF bf16's error (pos:xserv/bf16=ratio):" << failing);
    CHECK(*std::max_element(err.begin(), err.end()) <= max_gate);

    // 2. Greedy continuation of G tokens (one prefill, then one decode step per token).
    engine.reset();
    xserv::engine::Request req;
    req.prompt = ids;
    req.max_tokens = static_cast<int64_t>(G);
    const auto gen = xserv::engine::generate(engine, {req});
    const auto& got = gen.at(0).tokens;
    REQUIRE(got.size() == G);
    size_t gated = 0; // steps before HF bf16's first margin under the floor
    while (gated < G && bf16_margin[gated] >= kMarginFloor)
      ++gated;
    const size_t with_bf16 = shared_prefix(got, bf16_greedy);
    const size_t with_fp32 = shared_prefix(got, fp32_greedy);
    const size_t bf16_fp32 = shared_prefix(bf16_greedy, fp32_greedy);
    MESSAGE(
        fmt::format("20b greedy {} ({}): xserv shares {} steps with HF bf16 (gate: first {}, HF "
                    "bf16 margin < {} at step {}), {} with HF fp32; HF bf16 shares {} with HF "
                    "fp32",
                    G, mode, with_bf16, gated, kMarginFloor, gated, with_fp32, bf16_fp32));
    for (size_t i = 0; i < gated; ++i) {
      CHECK_MESSAGE(got[i] == bf16_greedy[i],
                    "greedy step " << i << ": xserv " << got[i] << " != HF bf16 " << bf16_greedy[i]
                                   << " (margin " << bf16_margin[i] << ")");
      if (got[i] != bf16_greedy[i])
        break;
    }
  }
}
