// Op-by-op checks of the reference math against values computed independently here.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "ir/reference.h"
#include "tests/test_util.h"

using namespace xserv::ir;

namespace {

Tensor randn(std::vector<int64_t> shape, std::mt19937& rng, float stddev = 1.0f) {
  Tensor t = Tensor::zeros(DType::F32, std::move(shape));
  std::normal_distribution<float> nd(0.0f, stddev);
  for (float& v : t.f)
    v = nd(rng);
  return t;
}

Tensor ints(std::vector<int32_t> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return Tensor::from_ints({n}, std::move(v));
}

} // namespace

TEST_CASE("rms_norm: x / sqrt(mean(x^2) + eps) * w") {
  Tensor x = Tensor::from_floats({2, 4}, {1, 2, 3, 4, -2, 0, 0, 2});
  Tensor w = Tensor::from_floats({4}, {1, 0.5f, 2, 1});
  Tensor y = ref::rms_norm(x, w, 1e-5);
  const double r0 = 1 / std::sqrt(30.0 / 4 + 1e-5), r1 = 1 / std::sqrt(8.0 / 4 + 1e-5);
  const double want[8] = {1 * r0, 2 * r0 * 0.5, 3 * r0 * 2, 4 * r0, -2 * r1, 0, 0, 2 * r1};
  for (int i = 0; i < 8; ++i)
    CHECK(y.f[static_cast<size_t>(i)] == doctest::Approx(want[i]).epsilon(1e-6));
}

TEST_CASE("linear with bias") {
  Tensor x = Tensor::from_floats({1, 3}, {1, 2, 3});
  Tensor w = Tensor::from_floats({2, 3}, {1, 0, -1, 0.5f, 0.5f, 0.5f});
  Tensor b = Tensor::from_floats({2}, {10, -1});
  Tensor y = ref::linear(x, w, &b);
  CHECK(y.f == std::vector<float>{8, 2});
  CHECK(ref::linear(x, w, nullptr).f == std::vector<float>{-2, 3});
}

TEST_CASE("YaRN inverse frequencies and scaled cos/sin match the float64 reference table") {
  XSERV_REQUIRE_DATA(data);
  std::ifstream in(data / "yarn_rope_reference.json");
  const auto ref_doc = nlohmann::json::parse(in);
  ref::Yarn y;
  y.theta = ref_doc["rope_theta"];
  y.factor = ref_doc["factor"];
  y.original_max = ref_doc["original_max_position_embeddings"];
  y.beta_fast = ref_doc["beta_fast"];
  y.beta_slow = ref_doc["beta_slow"];
  y.truncate = ref_doc["truncate"];
  const int64_t d = ref_doc["head_dim"];
  auto inv = ref::yarn_inv_freq(y, d);
  REQUIRE(inv.size() == 32);
  for (size_t i = 0; i < inv.size(); ++i)
    CHECK(inv[i] == doctest::Approx(ref_doc["inv_freq"][i].get<double>()).epsilon(1e-12));
  CHECK(ref::yarn_attention_factor(y) ==
        doctest::Approx(ref_doc["attention_factor"].get<double>()).epsilon(1e-12));

  // rope_yarn on unit vectors reads the cos/sin tables back: x = e_i gives
  // out[i] = cos_i, out[i+32] = sin_i.
  for (const auto& [pos, cs] : ref_doc["cos_sin_scaled"].items()) {
    const int32_t p = std::stoi(pos);
    for (int64_t i = 0; i < d / 2; ++i) {
      Tensor x = Tensor::zeros(DType::F32, {1, 1, d});
      x.f[static_cast<size_t>(i)] = 1.0f;
      Tensor out = ref::rope_yarn(x, ints({p}), y);
      const double c = cs["cos"][static_cast<size_t>(i)], s = cs["sin"][static_cast<size_t>(i)];
      // fp32 output of a float64 computation: absolute error within float rounding.
      CHECK(out.f[static_cast<size_t>(i)] == doctest::Approx(c).epsilon(1e-6).scale(1));
      CHECK(out.f[static_cast<size_t>(i + d / 2)] == doctest::Approx(s).epsilon(1e-6).scale(1));
    }
  }
}

TEST_CASE("rope_yarn rotates halves: [x1 c - x2 s, x2 c + x1 s]") {
  std::mt19937 rng(3);
  Tensor x = randn({2, 3, 8}, rng);
  ref::Yarn y;
  y.factor = 1.0; // plain RoPE: inv_freq = theta^(-2i/d), attention factor 1
  y.theta = 10000;
  Tensor out = ref::rope_yarn(x, ints({0, 5}), y);
  for (size_t k = 0; k < 24; ++k) // position 0 is the identity
    CHECK(out.f[k] == doctest::Approx(x.f[k]));
  for (int64_t h = 0; h < 3; ++h)
    for (int64_t i = 0; i < 4; ++i) {
      const double ang = 5 * std::pow(10000.0, -2.0 * static_cast<double>(i) / 8);
      const size_t base = static_cast<size_t>((3 + h) * 8);
      const double x1 = x.f[base + static_cast<size_t>(i)],
                   x2 = x.f[base + static_cast<size_t>(i) + 4];
      CHECK(out.f[base + static_cast<size_t>(i)] ==
            doctest::Approx(x1 * std::cos(ang) - x2 * std::sin(ang)));
      CHECK(out.f[base + static_cast<size_t>(i) + 4] ==
            doctest::Approx(x2 * std::cos(ang) + x1 * std::sin(ang)));
    }
}

TEST_CASE("router_topk picks the k largest and softmaxes over them only") {
  Tensor logits = Tensor::from_floats({2, 5}, {0.1f, 3, -1, 2, 2.5f, 5, 5, 1, 0, -3});
  Tensor w, ids;
  ref::router_topk(logits, 3, w, ids);
  CHECK(ids.i == std::vector<int32_t>{1, 4, 3, 0, 1, 2}); // ties: lower index first
  const double z0 = std::exp(3.0) + std::exp(2.5) + std::exp(2.0);
  CHECK(w.f[0] == doctest::Approx(std::exp(3.0) / z0));
  CHECK(w.f[1] == doctest::Approx(std::exp(2.5) / z0));
  CHECK(w.f[2] == doctest::Approx(std::exp(2.0) / z0));
  const double z1 = 2 * std::exp(5.0) + std::exp(1.0);
  CHECK(w.f[3] == doctest::Approx(std::exp(5.0) / z1));
  CHECK(w.f[5] == doctest::Approx(std::exp(1.0) / z1));
}

TEST_CASE("moe_experts: clamped SwiGLU over interleaved gate/up rows, weighted sum") {
  // One token, D=2, I=1, two experts; gate_up row 0 = gate, row 1 = up.
  Tensor x = Tensor::from_floats({1, 2}, {1, 2});
  Tensor gu = Tensor::from_floats({2, 2, 2}, {3, 1, /*up*/ 1, 0, /*e1*/ -1, 0, 5, 5});
  Tensor gub = Tensor::from_floats({2, 2}, {0.5f, 0, 0, 0});
  Tensor dn = Tensor::from_floats({2, 2, 1}, {1, -1, 2, 0.5f});
  Tensor dnb = Tensor::from_floats({2, 2}, {0, 0.25f, 0, 0});
  Tensor w = Tensor::from_floats({1, 2}, {0.75f, 0.25f});
  Tensor ids = Tensor::from_ints({1, 2}, {0, 1});
  Tensor y = ref::moe_experts(x, w, ids, gu, gub, dn, dnb, 7.0, 1.702);
  auto silu_part = [](double g) { return g / (1 + std::exp(-1.702 * g)); };
  // expert 0: gate = 3*1+1*2+0.5 = 5.5 (under the limit), up = 1 -> act = 2*glu(5.5)
  const double a0 = (1 + 1) * silu_part(5.5);
  // expert 1: gate = -1, up = 15 clamped to 7 -> act = 8*glu(-1)
  const double a1 = (7 + 1) * silu_part(-1.0);
  CHECK(y.f[0] == doctest::Approx(0.75 * (a0 * 1) + 0.25 * (a1 * 2)));
  CHECK(y.f[1] == doctest::Approx(0.75 * (a0 * -1 + 0.25) + 0.25 * (a1 * 0.5)));
  // A gate above the limit is clamped to 7.
  Tensor gu2 = gu;
  gu2.f[0] = 30;
  Tensor y2 = ref::moe_experts(x, w, ids, gu2, gub, dn, dnb, 7.0, 1.702);
  const double a0c = 2 * silu_part(7.0);
  CHECK(y2.f[0] == doctest::Approx(0.75 * a0c + 0.25 * (a1 * 2)));
}

TEST_CASE("embedding, select_rows and argmax") {
  Tensor table = Tensor::from_floats({3, 2}, {0, 1, 2, 3, 4, 5});
  CHECK(ref::embedding(table, ints({2, 0})).f == std::vector<float>{4, 5, 0, 1});
  CHECK_THROWS_AS(ref::embedding(table, ints({3})), xserv::Error);
  CHECK(ref::select_rows(table, ints({1})).f == std::vector<float>{2, 3});
  Tensor x = Tensor::from_floats({2, 3}, {1, 9, 9, -1, -2, -0.5f});
  CHECK(ref::argmax(x).i == std::vector<int32_t>{1, 2});
}
