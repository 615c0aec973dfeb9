// What the dense linears' canonical order can rest on (issue: batch invariance by default):
// which orders of a dot product's tensor-core sums give the same fp32 bits. Part of kernels_bench
// (never run by ctest; the findings go to docs/DESIGN.md and the issue):
//   build/tests/kernels_bench -tc="dense K order*"
// 1. Inside one MMA: a chain of mma.sync m16n8k16 over K in natural order against the same
//    chain with each instruction's 16 products in other positions (reversed), and against
//    gemm_wg's slot grouping (other K values share an instruction).
// 2. cuBLAS (runtime::Blas, the plans' library call) at 1 to 2,048 rows: against the natural
//    chain, and against its own rows at 2,048 (is it invariant in the rows it is given?).
// 3. cublasLt without split K (kernels_bench -tc="dense K order: cublasLt*"): one algorithm at
//    every row count against the natural chain, and its time against the plans' call.
// 4. cublasLt with a fixed split K (out-of-place reductions): whether its sums are s natural
//    chains over fixed K ranges added in a fixed order at every row count, an order whose
//    decode kernels could split K as the canonical ones do while prompts stay on cuBLAS.
#include "runtime/blas.h"
#include "tests/codegen/kernel_test_util.h"
#include "tests/codegen/order_chain.h"

#if XSERV_HAVE_CUBLASLT
#include <cublasLt.h>
#endif

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
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

#if XSERV_HAVE_CUBLASLT
namespace {

void lt_ok(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    FAIL(what << ": cuBLASLt status " << int(st));
}

/// y[rows, n] = x[rows, k] w[n, k]^T through cublasLt, as runtime::Blas lays it out (column-major
/// y^T = op_T(w) x^T), fp32 out and accumulation; the algorithm picked by the heuristic with
/// only the reductions in `mask` allowed (CUBLASLT_REDUCTION_SCHEME_NONE: no split K).
struct LtGemm {
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  std::unique_ptr<DevBuf> ws = poisoned(size_t(8) << 20); // 32 MiB
  int n, k;
  LtGemm(int n_, int k_) : n(n_), k(k_) {
    lt_ok(cublasLtCreate(&lt), "create");
    lt_ok(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
    const cublasOperation_t t = CUBLAS_OP_T;
    lt_ok(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)), "transa");
  }
  ~LtGemm() {
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(lt);
  }
  struct Layouts {
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    Layouts(int n, int k, int rows) {
      lt_ok(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, k, n, k), "layout w");
      lt_ok(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, k, rows, k), "layout x");
      lt_ok(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, n, rows, n), "layout y");
    }
    ~Layouts() {
      cublasLtMatrixLayoutDestroy(a);
      cublasLtMatrixLayoutDestroy(b);
      cublasLtMatrixLayoutDestroy(c);
    }
  };
  /// The heuristic's first algorithm at `rows` under `mask`; false when it offers none.
  bool pick(int rows, uint32_t mask, cublasLtMatmulAlgo_t& algo) {
    Layouts l(n, k, rows);
    cublasLtMatmulPreference_t pref = nullptr;
    lt_ok(cublasLtMatmulPreferenceCreate(&pref), "preference");
    const uint64_t bytes = size_t(32) << 20;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes,
                                         sizeof(bytes));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask,
                                         sizeof(mask));
    cublasLtMatmulHeuristicResult_t r{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(lt, op, l.a, l.b, l.c, l.c, pref, 1, &r, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0)
      return false;
    algo = r.algo;
    return true;
  }
  /// Runs `algo` at `rows` (false when it does not take them within the 32 MiB workspace).
  bool run(const cublasLtMatmulAlgo_t& algo, int rows, const void* x, const void* w, void* y) {
    Layouts l(n, k, rows);
    cublasLtMatmulHeuristicResult_t check{};
    if (cublasLtMatmulAlgoCheck(lt, op, l.a, l.b, l.c, l.c, &algo, &check) !=
            CUBLAS_STATUS_SUCCESS ||
        check.workspaceSize > (size_t(32) << 20))
      return false;
    const float one = 1.0f, zero = 0.0f;
    lt_ok(cublasLtMatmul(lt, op, &one, w, l.a, x, l.b, &zero, y, l.c, y, l.c, &algo, ws->p,
                         size_t(32) << 20, nullptr),
          "matmul");
    return true;
  }
};

std::string algo_name(const cublasLtMatmulAlgo_t& a) {
  int32_t id = -1, splitk = -1;
  uint32_t tile = 0, scheme = 0;
  size_t w = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk),
                                       &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                       sizeof(scheme), &w);
  return "algo " + std::to_string(id) + " tile " + std::to_string(tile) + " split K " +
         std::to_string(splitk) + " reduction " + std::to_string(scheme);
}

} // namespace

TEST_CASE("dense K order: cublasLt without split K, one algorithm at every row count "
          "(informational)") {
  XSERV_REQUIRE_GPU();
  // Whether the dense canonical order can be the natural chain with cuBLAS serving prompts:
  // the heuristic restricted to no reduction (CUBLASLT_REDUCTION_SCHEME_NONE), its pick at the
  // largest step pinned and run at every row count, against the natural chain (bits) and the
  // plans' cublasGemmEx (time); the per-count pick too.
  struct Shape {
    const char* name;
    int k, n, max_t;
  };
  const Shape shapes[] = {{"20b qkv", 2880, 5120, 2048},
                          {"20b o_proj", 4096, 2880, 2048},
                          {"20b router", 2880, 32, 2048},
                          {"20b lm_head", 2880, 201088, 256}};
  for (const Shape& s : shapes) {
    Rng rng{4343};
    auto x = upload(random_bf16(rng, {s.max_t, s.k}, 1.0f).bits);
    auto w = upload(random_bf16(rng, {s.n, s.k}, 1.0f / std::sqrt(float(s.k))).bits);
    const std::vector<float> natural = run_chain(*x, *w, s.max_t, s.n, s.k, 0);
    LtGemm g(s.n, s.k);
    cublasLtMatmulAlgo_t pinned{};
    REQUIRE(g.pick(s.max_t, CUBLASLT_REDUCTION_SCHEME_NONE, pinned));
    MESSAGE(s.name << ": pinned " << algo_name(pinned) << " (the no-reduction pick at " << s.max_t
                   << " rows)");
    runtime::Blas blas;
    for (int t : {1, 2, 8, 16, 64, 65, 128, 256, 512, 1000, 2048}) {
      if (t > s.max_t)
        continue;
      auto y = poisoned(size_t(t) * s.n);
      const size_t count = size_t(t) * s.n;
      std::string line = fmt::format("{} at {} rows:", s.name, t);
      if (g.run(pinned, t, x->p, w->p, y->p)) {
        device_sync();
        const double ms = median_ms([&](int) { g.run(pinned, t, x->p, w->p, y->p); });
        line += fmt::format(" pinned {} of {} differ from the chain, {:.1f} us;",
                            differing(download(*y, count), natural, count), count, ms * 1e3);
      } else {
        line += " pinned: does not take these rows;";
      }
      cublasLtMatmulAlgo_t own{};
      if (g.pick(t, CUBLASLT_REDUCTION_SCHEME_NONE, own) && g.run(own, t, x->p, w->p, y->p)) {
        device_sync();
        const double ms = median_ms([&](int) { g.run(own, t, x->p, w->p, y->p); });
        line += fmt::format(" own pick ({}) {} differ, {:.1f} us;", algo_name(own),
                            differing(download(*y, count), natural, count), ms * 1e3);
      }
      blas.gemm_bf16(nullptr, s.n, s.k, t, false, x->p, w->p, y->p);
      device_sync();
      const int plain = differing(download(*y, count), natural, count);
      const double ms =
          median_ms([&](int) { blas.gemm_bf16(nullptr, s.n, s.k, t, false, x->p, w->p, y->p); });
      MESSAGE(line << fmt::format(" cublasGemmEx {} differ, {:.1f} us", plain, ms * 1e3));
    }
  }
}

TEST_CASE("dense K order: cublasLt with a fixed split K, against K ranges chained and added "
          "(informational)") {
  XSERV_REQUIRE_GPU();
  // The no-split pick at 2,048 rows with CUBLASLT_ALGO_CONFIG_SPLITK_NUM set to s and an
  // out-of-place reduction (or in place), run at 1 to 2,048 rows, against the natural chain over
  // each of s K ranges (ranges of ceil(K / s) rounded up to g values, g 16 to 256) added in
  // order, in reverse, or pairwise; and its time at 1 and 2,048 rows.
  struct Shape {
    const char* name;
    int k, n;
  };
  const int kMaxT = 2048;
  for (const Shape& s : {Shape{"20b o_proj", 4096, 2880}, Shape{"20b qkv", 2880, 5120}}) {
    Rng rng{4444};
    const Bf16Weight xb = random_bf16(rng, {kMaxT, s.k}, 1.0f);
    const Bf16Weight wb = random_bf16(rng, {s.n, s.k}, 1.0f / std::sqrt(float(s.k)));
    auto x = upload(xb.bits), w = upload(wb.bits);
    LtGemm g(s.n, s.k);
    cublasLtMatmulAlgo_t base{};
    REQUIRE(g.pick(kMaxT, CUBLASLT_REDUCTION_SCHEME_NONE, base));
    // The chain over K values [a, b) of every row: the slices uploaded on their own.
    auto range_chain = [&](int a, int b) {
      std::vector<uint16_t> xs(size_t(kMaxT) * (b - a)), ws(size_t(s.n) * (b - a));
      for (int t = 0; t < kMaxT; ++t)
        std::copy_n(xb.bits.begin() + std::ptrdiff_t(size_t(t) * s.k + a), b - a,
                    xs.begin() + std::ptrdiff_t(size_t(t) * (b - a)));
      for (int r = 0; r < s.n; ++r)
        std::copy_n(wb.bits.begin() + std::ptrdiff_t(size_t(r) * s.k + a), b - a,
                    ws.begin() + std::ptrdiff_t(size_t(r) * (b - a)));
      auto dx = upload(xs), dw = upload(ws);
      return run_chain(*dx, *dw, kMaxT, s.n, b - a, 0);
    };
    for (int32_t splits : {2, 4, 8}) {
      // The reference sums of each range rule: forward, reverse, pairwise.
      std::vector<std::pair<std::string, std::vector<float>>> refs;
      for (int gran : {16, 32, 64, 128, 256}) {
        const int chunk = (s.k / splits + gran - 1) / gran * gran;
        if (chunk * (splits - 1) >= s.k)
          continue;
        std::vector<std::vector<float>> parts;
        for (int i = 0; i < splits; ++i)
          parts.push_back(range_chain(i * chunk, std::min(s.k, (i + 1) * chunk)));
        std::vector<float> fwd = parts[0], rev = parts.back(), tree = parts[0];
        for (int i = 1; i < splits; ++i)
          for (size_t j = 0; j < fwd.size(); ++j) {
            fwd[j] += parts[size_t(i)][j];
            rev[j] += parts[size_t(splits - 1 - i)][j];
          }
        std::vector<std::vector<float>> level = parts;
        while (level.size() > 1) {
          std::vector<std::vector<float>> next;
          for (size_t i = 0; i + 1 < level.size(); i += 2) {
            next.push_back(level[i]);
            for (size_t j = 0; j < next.back().size(); ++j)
              next.back()[j] += level[i + 1][j];
          }
          if (level.size() % 2)
            next.push_back(level.back());
          level = std::move(next);
        }
        tree = level[0];
        refs.push_back({fmt::format("ranges of {} forward", chunk), std::move(fwd)});
        refs.push_back({fmt::format("ranges of {} reverse", chunk), std::move(rev)});
        refs.push_back({fmt::format("ranges of {} pairwise", chunk), std::move(tree)});
      }
      for (uint32_t scheme : {uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE),
                              uint32_t(CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE),
                              uint32_t(CUBLASLT_REDUCTION_SCHEME_INPLACE)}) {
        cublasLtMatmulAlgo_t a = base;
        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                             sizeof(splits));
        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                             sizeof(scheme));
        std::string line = fmt::format("{} split {} scheme {}:", s.name, splits, scheme);
        for (int t : {1, 8, 64, 512, 2048}) {
          auto y = poisoned(size_t(t) * s.n);
          if (!g.run(a, t, x->p, w->p, y->p)) {
            line += fmt::format(" {} rows refused;", t);
            continue;
          }
          device_sync();
          const std::vector<float> got = download(*y, size_t(t) * s.n);
          const size_t count = got.size();
          int best = int(count);
          std::string best_name = "-";
          for (const auto& [name, ref] : refs)
            if (const int d = differing(got, ref, count); d < best) {
              best = d;
              best_name = name;
            }
          line += fmt::format(" {} rows: {} of {} differ from {}", t, best, count, best_name);
          if (t == 1 || t == kMaxT)
            line += fmt::format(" ({:.1f} us)",
                                median_ms([&](int) { g.run(a, t, x->p, w->p, y->p); }) * 1e3);
          line += ";";
        }
        MESSAGE(line);
      }
    }
  }
}
#endif
