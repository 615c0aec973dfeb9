// CPU tests of weight loading: checkpoint -> WeightSpecs, spec and file validation, the arena
// layout, the dequant kernel compiling, and a clear "no GPU" from upload() on machines without one.
#include "base/error.h"
#include "compiler/partition.h"
#include "engine/weight_specs.h"
#include "models/checkpoint.h"
#include "models/gpt_oss.h"
#include "models/safetensors.h"
#include "models/synth.h"
#include "runtime/device.h"
#include "runtime/nvrtc.h"
#include "runtime/weights.h"
#include "tests/test_util.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>

namespace fs = std::filesystem;
using xserv::testing::TempDir;
using namespace xserv;
using runtime::WeightSpec;

namespace {

/// examples/tiny/config.json, inline so the test does not depend on where the tree lives.
models::ModelConfig tiny_config() {
  auto doc = nlohmann::json::parse(R"({
    "architectures": ["GptOssForCausalLM"], "attention_bias": true,
    "eos_token_id": [200002, 199999, 200012], "experts_per_token": 2, "head_dim": 16,
    "hidden_size": 64, "initial_context_length": 4096, "intermediate_size": 64,
    "layer_types": ["sliding_attention", "full_attention"], "max_position_embeddings": 131072,
    "model_type": "gpt_oss", "num_attention_heads": 4, "num_experts_per_tok": 2,
    "num_hidden_layers": 2, "num_key_value_heads": 2, "num_local_experts": 8,
    "pad_token_id": 199999, "quantization_config": {"quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": false},
    "rope_theta": 150000, "sliding_window": 8, "swiglu_limit": 7.0,
    "tie_word_embeddings": false, "vocab_size": 201088})");
  return models::ModelConfig::from_json(doc, "tiny config");
}

std::string error_of(const auto& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

/// A small file of `n` bytes, and a Copy spec for all of it as BF16 [n / 2].
WeightSpec bf16_spec(const fs::path& file, const std::string& name, uint64_t n) {
  std::ofstream(file, std::ios::binary) << std::string(n, '\x3f');
  WeightSpec s;
  s.name = name;
  s.data = {name, file.string(), 0, n, "BF16", {int64_t(n / 2)}};
  s.shape = {int64_t(n / 2)};
  return s;
}

} // namespace

TEST_CASE("weight_specs: a tiny checkpoint becomes Copy specs and one Mxfp4ToBf16 per pair") {
  TempDir dir;
  models::SynthOptions so;
  so.seed = 3;
  so.shard_size = 20'000'000; // several shards
  models::synth_checkpoint(tiny_config(), dir.path, so);
  auto ck = models::Checkpoint::open(dir.path); // headers only is enough
  REQUIRE(ck.files().size() > 1);
  std::vector<WeightSpec> specs = engine::weight_specs(ck);

  std::set<std::string> names;
  size_t mxfp4 = 0;
  for (const WeightSpec& s : specs) {
    names.insert(s.name);
    if (s.transform == WeightSpec::Transform::Copy) {
      const models::TensorInfo& t = ck.info(s.name);
      CHECK(!s.scales);
      CHECK(s.data.dtype == t.dtype);
      CHECK(s.data.offset == t.offset);
      CHECK(s.data.bytes == t.size);
      CHECK(s.data.file == ck.file_of(s.name).string());
      CHECK(s.shape == t.shape);
      continue;
    }
    ++mxfp4;
    REQUIRE(s.scales);
    const models::TensorInfo &b = ck.info(s.name + "_blocks"), &sc = ck.info(s.name + "_scales");
    CHECK(s.data.name == b.name);
    CHECK(s.data.offset == b.offset);
    CHECK(s.scales->name == sc.name);
    CHECK(s.scales->offset == sc.offset);
    CHECK(s.scales->file == ck.file_of(sc.name).string());
    CHECK(s.shape == std::vector<int64_t>{b.shape[0], b.shape[1], b.shape[2] * 32});
  }
  const auto& c = ck.config();
  CHECK(mxfp4 == size_t(2 * c.num_hidden_layers));
  CHECK(names.size() == specs.size());
  CHECK(specs.size() == ck.tensor_names().size() - mxfp4);
  CHECK(names.count("model.layers.1.mlp.experts.down_proj"));
  CHECK(names.count("model.layers.1.mlp.experts.down_proj_bias"));
  auto it = std::find_if(specs.begin(), specs.end(), [](const WeightSpec& s) {
    return s.name == "model.layers.0.mlp.experts.gate_up_proj";
  });
  REQUIRE(it != specs.end());
  CHECK(it->shape == std::vector<int64_t>{8, 128, 64});

  // The layout places every tensor at an aligned offset, without overlap, in spec order.
  runtime::WeightLayout layout = runtime::layout_weights(specs);
  REQUIRE(layout.tensors.size() == specs.size());
  uint64_t end = 0, source = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const runtime::DeviceTensor& t = layout.tensors[i];
    CHECK(t.name == specs[i].name);
    CHECK(t.offset % runtime::kWeightAlignment == 0);
    CHECK(t.offset >= end);
    end = t.offset + t.bytes;
    bool q = specs[i].transform == WeightSpec::Transform::Mxfp4ToBf16;
    CHECK(t.dtype == (q ? "BF16" : specs[i].data.dtype));
    CHECK(t.bytes == (q ? specs[i].data.bytes * 4 : specs[i].data.bytes));
    source += specs[i].data.bytes + (q ? specs[i].scales->bytes : 0);
  }
  CHECK(layout.total_bytes >= end);
  CHECK(layout.total_bytes < end + runtime::kWeightAlignment);
  CHECK(layout.source_bytes == source);
}

TEST_CASE("weight_specs: --expert-format mxfp4 keeps the pairs as stored, both adds copies") {
  TempDir dir;
  models::SynthOptions so;
  so.seed = 4;
  models::synth_checkpoint(tiny_config(), dir.path, so);
  auto ck = models::Checkpoint::open(dir.path);
  const std::vector<WeightSpec> bf16 = engine::weight_specs(ck);
  const std::vector<WeightSpec> mx = engine::weight_specs(ck, runtime::ExpertFormat::Mxfp4);
  const std::vector<WeightSpec> both = engine::weight_specs(ck, runtime::ExpertFormat::Both);
  REQUIRE(mx.size() == bf16.size());
  const runtime::WeightLayout lm = runtime::layout_weights(mx);
  size_t pairs = 0;
  for (size_t i = 0; i < mx.size(); ++i) {
    CHECK(mx[i].name == bf16[i].name);
    if (bf16[i].transform != WeightSpec::Transform::Mxfp4ToBf16) {
      CHECK(mx[i].transform == WeightSpec::Transform::Copy);
      continue;
    }
    ++pairs;
    CHECK(mx[i].transform == WeightSpec::Transform::Mxfp4);
    // Blocks then scales, as stored: 17 bytes per 32 values, the scales at numel / 2.
    const runtime::DeviceTensor& t = lm.tensors[i];
    CHECK(t.dtype == "MXFP4");
    CHECK(t.bytes == mx[i].data.bytes + mx[i].scales->bytes);
    CHECK(runtime::mxfp4_scales_offset(mx[i].shape) == mx[i].data.bytes);
  }
  CHECK(pairs == size_t(2 * ck.config().num_hidden_layers));
  // Both: every BF16 spec, plus an MXFP4 copy of each pair under its own name.
  REQUIRE(both.size() == bf16.size() + pairs);
  size_t copies = 0;
  for (const WeightSpec& s : both) {
    if (s.transform != WeightSpec::Transform::Mxfp4)
      continue;
    ++copies;
    CHECK(s.name.size() > 6);
    CHECK(s.name == runtime::mxfp4_copy_name(s.name.substr(0, s.name.size() - 6)));
  }
  CHECK(copies == pairs);
  // Selecting by name (a stage layout) keeps a copy only when it is asked for.
  const std::string base = "model.layers.0.mlp.experts.gate_up_proj";
  CHECK(engine::weight_specs_named(ck, {base}, runtime::ExpertFormat::Both).size() == 1);
  CHECK(engine::weight_specs_named(ck, {base, runtime::mxfp4_copy_name(base)},
                                   runtime::ExpertFormat::Both)
            .size() == 2);
  runtime::ExpertFormat f = runtime::ExpertFormat::Bf16;
  CHECK(runtime::parse_expert_format("both", f));
  CHECK(f == runtime::ExpertFormat::Both);
  CHECK_FALSE(runtime::parse_expert_format("fp8", f));
}

TEST_CASE("weight_specs: MXFP4 blocks without their scales are an error naming both") {
  TempDir dir;
  std::ofstream(dir.path / "config.json") << tiny_config().to_json().dump();
  std::vector<models::TensorSpec> ts = {{"x.weight", "BF16", {2, 3}},
                                        {"m.experts.up_proj_blocks", "U8", {2, 4, 1, 16}}};
  std::string header = models::make_safetensors_header(ts, {});
  std::ofstream(dir.path / "model.safetensors", std::ios::binary)
      << header << std::string(12 + 128, '\x11');
  auto ck = models::Checkpoint::open(dir.path, {.map_data = false, .validate = false});
  std::string err = error_of([&] { engine::weight_specs(ck); });
  CHECK(err.find("m.experts.up_proj_blocks") != std::string::npos);
  CHECK(err.find("m.experts.up_proj_scales") != std::string::npos);
}

TEST_CASE("layout_weights: inconsistent specs are errors naming the weight and the file") {
  TempDir dir;
  WeightSpec good = bf16_spec(dir.path / "a.bin", "a", 64);
  CHECK(runtime::layout_weights({good}).total_bytes == 256);

  WeightSpec s = good;
  s.data.bytes = 62;
  std::string err = error_of([&] { runtime::layout_weights({s}); });
  CHECK(err.find("weight 'a'") != std::string::npos);
  CHECK(err.find("a.bin") != std::string::npos);
  CHECK(err.find("64 bytes but the source holds 62") != std::string::npos);

  s = good;
  s.data.dtype = "Q7";
  CHECK(error_of([&] { runtime::layout_weights({s}); }).find("unknown dtype 'Q7'") !=
        std::string::npos);
  s = good;
  s.shape = {3, 11};
  CHECK(error_of([&] { runtime::layout_weights({s}); }).find("logical shape [3, 11]") !=
        std::string::npos);
  CHECK(error_of([&] {
          runtime::layout_weights({good, good});
        }).find("listed twice") != std::string::npos);

  WeightSpec q;
  q.name = "e";
  q.transform = WeightSpec::Transform::Mxfp4ToBf16;
  q.data = {"e_blocks", "f.bin", 0, 2 * 3 * 16, "U8", {2, 3, 16}};
  q.shape = {2, 96};
  CHECK(error_of([&] { runtime::layout_weights({q}); }).find("needs its scales") !=
        std::string::npos);
  q.scales = runtime::WeightSource{"e_scales", "f.bin", 96, 6, "U8", {2, 3}};
  CHECK(runtime::layout_weights({q}).tensors[0].bytes == 2 * 96 * 2);
  q.scales->shape = {2, 4};
  CHECK(error_of([&] { runtime::layout_weights({q}); }).find("are not MXFP4") != std::string::npos);
  q.scales->shape = {2, 3};
  q.shape = {2, 3, 32};
  CHECK(error_of([&] { runtime::layout_weights({q}); }).find("should be [2, 96]") !=
        std::string::npos);
}

TEST_CASE("upload: missing files and ranges past the end are errors naming file and tensor") {
  TempDir dir;
  WeightSpec s = bf16_spec(dir.path / "w.bin", "w", 4096);
  runtime::UploadOptions o;

  WeightSpec missing = s;
  missing.data.file = (dir.path / "nope.bin").string();
  std::string err = error_of([&] { runtime::DeviceWeights::upload({missing}, o); });
  CHECK(err.find("weight 'w'") != std::string::npos);
  CHECK(err.find("nope.bin") != std::string::npos);
  CHECK(err.find("No such file") != std::string::npos);

  WeightSpec past = s;
  past.data.offset = 2;
  err = error_of([&] { runtime::DeviceWeights::upload({past}, o); });
  CHECK(err.find("weight 'w'") != std::string::npos);
  CHECK(err.find("w.bin") != std::string::npos);
  CHECK(err.find("[2, 4098)") != std::string::npos);
  CHECK(err.find("only 4096 bytes") != std::string::npos);

  // An offset so large that offset + bytes wraps around is still caught.
  past.data.offset = ~uint64_t(0) - 100;
  err = error_of([&] { runtime::DeviceWeights::upload({past}, o); });
  CHECK(err.find("only 4096 bytes") != std::string::npos);

  // The scales of an MXFP4 weight are checked too.
  WeightSpec q;
  q.name = "e";
  q.transform = WeightSpec::Transform::Mxfp4ToBf16;
  q.data = {"e_blocks", s.data.file, 0, 4 * 16, "U8", {4, 16}};
  q.scales = runtime::WeightSource{"e_scales", s.data.file, 4094, 4, "U8", {4}};
  q.shape = {128};
  err = error_of([&] { runtime::DeviceWeights::upload({q}, o); });
  CHECK(err.find("tensor 'e_scales'") != std::string::npos);

  runtime::UploadOptions small;
  small.staging_bytes = 4096;
  CHECK(error_of([&] { runtime::DeviceWeights::upload({s}, small); }).find("too small") !=
        std::string::npos);
}

TEST_CASE("upload: a valid upload without a GPU says there is none") {
  if (runtime::probe_device().available) {
    MESSAGE("skipped: a GPU is present (weights_gpu_test covers uploads)");
    return;
  }
  TempDir dir;
  WeightSpec s = bf16_spec(dir.path / "w.bin", "w", 4096);
  std::string err = error_of([&] { runtime::DeviceWeights::upload({s}, {}); });
  CHECK(err.find("cannot upload weights: no GPU") != std::string::npos);
}

TEST_CASE("the MXFP4 dequant kernel compiles for sm_90 without warnings") {
  runtime::CompileOptions o;
  o.arch = "sm_90";
  runtime::CompileResult r =
      runtime::compile_cuda(runtime::mxfp4_dequant_source(), "xserv_mxfp4_to_bf16", o);
  CHECK(!r.cubin.empty());
  CHECK(r.log.find("warning") == std::string::npos);
}

TEST_CASE("DeviceWeights: an empty one has no tensors and throws for lookups") {
  runtime::DeviceWeights w;
  CHECK(w.device_bytes() == 0);
  CHECK(w.find("x") == nullptr);
  CHECK(error_of([&] { w.get("x"); }).find("no weight named 'x'") != std::string::npos);
}

/// The weights graph `g` reads, by name (what a stage layout lists).
static std::vector<std::string> weights_read(const ir::Graph& g) {
  std::vector<std::string> names;
  for (const ir::Node& n : g.nodes)
    if (n.op == ir::Op::Weight)
      names.push_back(n.attr_str("name"));
  return names;
}

TEST_CASE("weight_specs_named: a pipeline stage uploads its own weights only") {
  TempDir dir;
  models::SynthOptions so;
  so.seed = 4;
  const models::ModelConfig cfg = tiny_config();
  models::synth_checkpoint(cfg, dir.path, so);
  auto ck = models::Checkpoint::open(dir.path);
  const ir::Graph whole = models::build_gpt_oss(cfg);
  const compiler::Partition p = compiler::partition_pipeline(whole, 2);
  const size_t all = engine::weight_specs(ck).size();
  CHECK(engine::weight_specs_named(ck, weights_read(whole)).size() == all);
  std::set<std::string> seen;
  size_t total = 0;
  for (const ir::Graph& stage : p.stages) {
    const std::vector<WeightSpec> specs = engine::weight_specs_named(ck, weights_read(stage));
    total += specs.size();
    for (const WeightSpec& s : specs) {
      CHECK(seen.insert(s.name).second); // no weight in two stages
      const bool first_stage = &stage == &p.stages[0];
      CHECK((s.name.find("model.layers.0.") == 0 || s.name.find("embed") != std::string::npos) ==
            first_stage);
    }
  }
  CHECK(total == all);
  // A graph reading a weight the checkpoint lacks: one error naming it.
  ir::Graph bad = p.stages[1];
  for (ir::Node& n : bad.nodes)
    if (n.op == ir::Op::Weight && n.attr_str("name") == "lm_head.weight")
      n.set_attr("name", std::string("lm_head.missing"));
  CHECK_THROWS_WITH(
      engine::weight_specs_named(ck, weights_read(bad)),
      doctest::Contains("the model reads weights the checkpoint lacks: lm_head.missing"));
}
