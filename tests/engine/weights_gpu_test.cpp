// GPU tests of weight upload: every tensor of synthetic checkpoints (tiny, extreme MXFP4 scales,
// a ~1.7 GB multi-shard one) read back and compared bit for bit with the CPU reference.
#include "base/error.h"
#include "engine/weight_specs.h"
#include "models/bf16.h"
#include "models/checkpoint.h"
#include "models/mxfp4.h"
#include "models/synth.h"
#include "runtime/device.h"
#include "runtime/weights.h"
#include "tests/test_util.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cuda_runtime_api.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

namespace fs = std::filesystem;
using xserv::testing::TempDir;
using namespace xserv;
using runtime::WeightSpec;

/// Skips the rest of a test case, saying why, when no GPU is usable.
#define XSERV_REQUIRE_GPU(dev)                                                                     \
  const runtime::DeviceInfo dev = runtime::probe_device();                                         \
  if (!dev.available) {                                                                            \
    MESSAGE("skipped: no GPU (" << dev.reason << ")");                                             \
    return;                                                                                        \
  }

namespace {

/// A gpt-oss config of the given size (the tiny example's other fields).
models::ModelConfig make_config(int layers, int hidden, int intermediate, int experts, int heads,
                                int kv_heads, int head_dim) {
  nlohmann::json doc = nlohmann::json::parse(R"({
    "architectures": ["GptOssForCausalLM"], "attention_bias": true,
    "eos_token_id": [200002, 199999, 200012], "initial_context_length": 4096,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "pad_token_id": 199999,
    "quantization_config": {"quant_method": "mxfp4"}, "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": false},
    "rope_theta": 150000, "sliding_window": 8, "swiglu_limit": 7.0,
    "tie_word_embeddings": false, "vocab_size": 201088})");
  doc["num_hidden_layers"] = layers;
  doc["hidden_size"] = hidden;
  doc["intermediate_size"] = intermediate;
  doc["num_local_experts"] = experts;
  doc["num_experts_per_tok"] = doc["experts_per_token"] = std::min(experts, 4);
  doc["num_attention_heads"] = heads;
  doc["num_key_value_heads"] = kv_heads;
  doc["head_dim"] = head_dim;
  std::vector<std::string> types;
  for (int l = 0; l < layers; ++l)
    types.push_back(l % 2 ? "full_attention" : "sliding_attention");
  doc["layer_types"] = types;
  return models::ModelConfig::from_json(doc, "test config");
}

models::ModelConfig tiny() {
  return make_config(2, 64, 64, 8, 4, 2, 16);
}

std::vector<uint8_t> download(const runtime::DeviceWeights& w, const std::string& name) {
  const runtime::DeviceTensor& t = w.tensor(name);
  std::vector<uint8_t> host(t.bytes);
  cudaError_t err = cudaMemcpy(host.data(), w.get(name), t.bytes, cudaMemcpyDeviceToHost);
  INFO("downloading " << name << ": " << cudaGetErrorString(err));
  REQUIRE(err == cudaSuccess);
  return host;
}

/// Compares bf16 bit patterns; reports the number of differences and the first one.
void check_bf16_equal(const std::string& name, const uint16_t* got, const uint16_t* want,
                      size_t n) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; ++i)
    if (got[i] != want[i] && bad++ == 0)
      first = i;
  INFO(name << ": " << bad << " of " << n << " bf16 values differ; first at " << first << ": got 0x"
            << std::hex << (bad ? got[first] : 0) << ", want 0x" << (bad ? want[first] : 0));
  CHECK(bad == 0);
}

/// Uploads `dir` and checks every tensor against the CPU reading of the checkpoint: Copy
/// tensors byte for byte, MXFP4 ones against float_to_bf16(models' decode) bit for bit.
void upload_and_compare(const fs::path& dir, runtime::UploadOptions options) {
  auto ck = models::Checkpoint::open(dir, {.map_data = true});
  std::vector<WeightSpec> specs = engine::weight_specs(ck);
  options.poison = true;
  std::vector<std::string> lines;
  options.progress = [&](const std::string& l) { lines.push_back(l); };
  options.progress_interval_s = 0;
  runtime::DeviceWeights w = runtime::DeviceWeights::upload(specs, options);
  MESSAGE(w.stats().summary());

  runtime::WeightLayout layout = runtime::layout_weights(specs);
  CHECK(w.device_bytes() == layout.total_bytes);
  CHECK(w.stats().bytes_read == layout.source_bytes);
  CHECK(w.stats().files == ck.files().size());
  REQUIRE(w.tensors().size() == specs.size());
  REQUIRE(!lines.empty());
  CHECK(lines.back().rfind("[load] done: ", 0) == 0);
  if (lines.size() > 1)
    CHECK(lines.front().rfind("[load] ", 0) == 0);

  uint64_t device_bytes = 0;
  std::vector<float> decoded;
  std::vector<uint16_t> want;
  for (const WeightSpec& s : specs) {
    std::vector<uint8_t> got = download(w, s.name);
    device_bytes += got.size();
    if (s.transform == WeightSpec::Transform::Copy) {
      std::span<const uint8_t> ref = ck.bytes(s.data.name);
      REQUIRE(ref.size() == got.size());
      CHECK_MESSAGE(std::memcmp(ref.data(), got.data(), got.size()) == 0, s.name << " differs");
      CHECK(w.tensor(s.name).dtype == s.data.dtype);
      continue;
    }
    CHECK(w.tensor(s.name).dtype == "BF16");
    CHECK(w.tensor(s.name).shape == s.shape);
    models::Mxfp4Tensor m = ck.mxfp4(s.name);
    const size_t per = size_t(m.rows * m.cols);
    REQUIRE(got.size() == per * size_t(m.experts) * 2);
    decoded.resize(per);
    want.resize(per);
    for (int64_t e = 0; e < m.experts; ++e) {
      m.decode_expert(e, decoded);
      for (size_t i = 0; i < per; ++i)
        want[i] = models::float_to_bf16(decoded[i]);
      check_bf16_equal(s.name + " expert " + std::to_string(e),
                       reinterpret_cast<const uint16_t*>(got.data()) + per * size_t(e), want.data(),
                       per);
    }
  }
  CHECK(w.stats().device_bytes == device_bytes);
}

} // namespace

TEST_CASE("upload: a tiny checkpoint lands on the GPU bit for bit") {
  XSERV_REQUIRE_GPU(dev);
  TempDir dir;
  models::SynthOptions so;
  so.seed = 11;
  models::synth_checkpoint(tiny(), dir.path / "ck", so);
  runtime::UploadOptions o;
  o.cache_dir = dir.path / "cache";
  upload_and_compare(dir.path / "ck", o);
}

TEST_CASE("upload: MXFP4 scale bytes 0..254 (overflow to inf, subnormals, -0.0) match the CPU") {
  XSERV_REQUIRE_GPU(dev);
  TempDir dir;
  models::SynthOptions so;
  so.seed = 5;
  so.expert_scale_lo = 0;
  so.expert_scale_hi = 255; // synth never writes 0xFF, E8M0's NaN
  so.shard_size = 10'000'000;
  models::synth_checkpoint(tiny(), dir.path / "ck", so);
  runtime::UploadOptions o;
  o.check_values = false;    // scale 0xFE overflows to inf, which the value check would refuse
  o.staging_bytes = 1 << 20; // the smallest: many pieces, tensors split across buffers
  o.staging_buffers = 2;
  o.host_threads = 3;
  upload_and_compare(dir.path / "ck", o);
}

TEST_CASE("upload: every (scale byte, block byte) pair decodes as the CPU reference") {
  XSERV_REQUIRE_GPU(dev);
  TempDir dir;
  // Block i has scale i / 16 and bytes (i % 16) * 16 + j: all 256 x 256 combinations.
  const int nblocks = 256 * 16;
  std::vector<uint8_t> blocks(nblocks * 16), scales(nblocks);
  for (int i = 0; i < nblocks; ++i) {
    scales[i] = uint8_t(i / 16);
    for (int j = 0; j < 16; ++j)
      blocks[i * 16 + j] = uint8_t((i % 16) * 16 + j);
  }
  const fs::path file = dir.path / "all.bin";
  {
    std::ofstream out(file, std::ios::binary);
    out << "pad!"; // sources need not be aligned in the file
    out.write(reinterpret_cast<const char*>(blocks.data()), std::streamsize(blocks.size()));
    out.write(reinterpret_cast<const char*>(scales.data()), std::streamsize(scales.size()));
  }
  WeightSpec s;
  s.name = "all";
  s.transform = WeightSpec::Transform::Mxfp4ToBf16;
  s.data = {"all_blocks", file.string(), 4, blocks.size(), "U8", {256, 16, 16}};
  s.scales = runtime::WeightSource{"all_scales",  file.string(), 4 + blocks.size(),
                                   scales.size(), "U8",          {256, 16}};
  s.shape = {256, 512};
  runtime::UploadOptions o;
  o.poison = true;
  o.check_values = false; // scale 0xFF is refused by the check; the decode itself is tested here
  runtime::DeviceWeights w = runtime::DeviceWeights::upload({s}, o);
  std::vector<uint8_t> got = download(w, "all");
  REQUIRE(got.size() == size_t(nblocks) * 64);
  std::vector<uint16_t> want(size_t(nblocks) * 32);
  float f[32];
  for (int i = 0; i < nblocks; ++i) {
    models::mxfp4_decode_block(&blocks[i * 16], scales[i], f);
    for (int v = 0; v < 32; ++v)
      want[i * 32 + v] = models::float_to_bf16(f[v]);
  }
  const auto* g = reinterpret_cast<const uint16_t*>(got.data());
  check_bf16_equal("all", g, want.data(), want.size());
  // Spot checks of the edges: block 255*16+7 has scale 255 and first byte 0x70 (values +0 and
  // 6 * 2^128), block 255*16+15 first byte 0xF0; block 0 has scale 0 and bytes 0, 1, .., 15.
  auto at = [&](int block, int v) { return g[block * 32 + v]; };
  CHECK(at(255 * 16 + 7, 1) == 0x7F80);  // 6 * 2^128 overflows to +inf
  CHECK(at(255 * 16 + 15, 1) == 0xFF80); // -6 * 2^128 -> -inf
  CHECK(at(0, 2) == 0x0020);             // byte 1, low nibble 1: 0.5 * 2^-127 = 2^-128
  CHECK(at(0, 16) == 0x8000);            // byte 8, low nibble 8: -0.0
}

namespace {

/// Overwrites `bytes` at element `index` (of `elem` bytes) of tensor `name` in checkpoint `dir`.
void patch_tensor(const fs::path& dir, const std::string& name, size_t index, size_t elem,
                  std::vector<uint8_t> bytes) {
  auto ck = models::Checkpoint::open(dir, {.map_data = false});
  const models::TensorInfo& t = ck.info(name);
  std::fstream f(ck.file_of(name), std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(std::streamoff(t.offset + index * elem));
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  REQUIRE(f.good());
}

/// The message of the upload of checkpoint `dir`, or "" when it succeeds.
std::string upload_error(const fs::path& dir, const runtime::UploadOptions& o = {}) {
  auto ck = models::Checkpoint::open(dir, {.map_data = true});
  try {
    runtime::DeviceWeights::upload(engine::weight_specs(ck), o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

} // namespace

TEST_CASE("upload: non-finite weights and scale byte 0xFF are refused naming the tensor") {
  XSERV_REQUIRE_GPU(dev);
  TempDir dir;
  models::synth_checkpoint(tiny(), dir.path / "ck", {});
  CHECK(upload_error(dir.path / "ck").empty());

  const std::string norm = "model.layers.1.post_attention_layernorm.weight";
  models::synth_checkpoint(tiny(), dir.path / "nan", {});
  patch_tensor(dir.path / "nan", norm, 5, 2, {0xC0, 0x7F}); // bf16 0x7FC0: NaN
  std::string e = upload_error(dir.path / "nan");
  CHECK(e.find("weight '" + norm + "': element 5 is NaN") != std::string::npos);
  CHECK(e.find("non-finite") != std::string::npos);

  models::synth_checkpoint(tiny(), dir.path / "inf", {});
  patch_tensor(dir.path / "inf", "lm_head.weight", 64 * 7, 2, {0x80, 0xFF}); // -inf, row 7
  e = upload_error(dir.path / "inf");
  CHECK(e.find("weight 'lm_head.weight': element 448 is infinite") != std::string::npos);

  const std::string experts = "model.layers.0.mlp.experts.down_proj";
  models::synth_checkpoint(tiny(), dir.path / "scale", {});
  patch_tensor(dir.path / "scale", experts + "_scales", 3, 1, {0xFF});
  e = upload_error(dir.path / "scale");
  CHECK(e.find("weight '" + experts + "': scale byte 0xFF (E8M0 NaN) at index 3 of '" + experts +
               "_scales'") != std::string::npos);

  // A plan whose gemms scale with one multiply (options.mxfp4_max_scale) refuses a larger
  // scale byte, even with the value checks off.
  runtime::UploadOptions small;
  small.max_scale = 120;
  CHECK(upload_error(dir.path / "ck", small).empty()); // synth's scales: 116..118
  models::synth_checkpoint(tiny(), dir.path / "past", {});
  patch_tensor(dir.path / "past", experts + "_scales", 9, 1, {121});
  small.check_values = false;
  e = upload_error(dir.path / "past", small);
  CHECK(e.find("weight '" + experts + "': scale byte 121 at index 9 of '" + experts + "_scales'") !=
        std::string::npos);
  CHECK(e.find("past 120, the largest the plan was compiled for") != std::string::npos);

  // Scale 0xFE with code 7 (6.0) is 6 * 2^127: infinite once dequantised.
  models::synth_checkpoint(tiny(), dir.path / "big", {});
  patch_tensor(dir.path / "big", experts + "_scales", 0, 1, {0xFE});
  patch_tensor(dir.path / "big", experts + "_blocks", 0, 1, {0x77});
  e = upload_error(dir.path / "big");
  CHECK(e.find("weight '" + experts + "': element 0 is infinite after MXFP4 dequantisation") !=
        std::string::npos);
}

TEST_CASE("upload: a multi-shard ~1.7 GB checkpoint with odd staging sizes, then from the cache") {
  XSERV_REQUIRE_GPU(dev);
  TempDir dir;
  models::SynthOptions so;
  so.seed = 21;
  so.shard_size = 300'000'000;
  so.expert_scale_lo = 100;
  so.expert_scale_hi = 140;
  models::synth_checkpoint(make_config(4, 1024, 1024, 32, 16, 4, 64), dir.path / "ck", so);
  runtime::UploadOptions o;
  o.cache_dir = dir.path / "cache";
  o.staging_bytes = (5 << 20) + 4096 * 3 + 100; // not a multiple of 17, 256 or a page
  o.staging_buffers = 3;
  o.host_threads = 5;
  upload_and_compare(dir.path / "ck", o);

  // The second upload finds the kernel in the cache; default options.
  auto ck = models::Checkpoint::open(dir.path / "ck");
  runtime::UploadOptions d;
  d.cache_dir = o.cache_dir;
  runtime::DeviceWeights w = runtime::DeviceWeights::upload(engine::weight_specs(ck), d);
  CHECK_FALSE(w.stats().kernel_compiled);
  CHECK(w.stats().device_bytes > 1'500'000'000);
  MESSAGE(w.stats().summary());
}

TEST_CASE("DeviceWeights: lookups, moves and a clear error for unknown names") {
  XSERV_REQUIRE_GPU(dev);
  TempDir dir;
  std::ofstream(dir.path / "a.bin", std::ios::binary) << std::string(1000, 'x');
  WeightSpec a;
  a.name = "a";
  a.data = {"a", (dir.path / "a.bin").string(), 0, 1000, "U8", {10, 100}};
  a.shape = {1000};
  WeightSpec b = a;
  b.name = "b";
  b.data.offset = 500;
  b.data.bytes = 500;
  b.data.dtype = "BF16";
  b.data.shape = b.shape = {250};
  runtime::DeviceWeights w = runtime::DeviceWeights::upload({a, b}, {});
  CHECK(w.device_bytes() == 1024 + 512);
  CHECK(w.tensor("b").offset == 1024);
  CHECK(w.tensor("b").dtype == "BF16");
  CHECK(w.tensor("a").shape == std::vector<int64_t>{1000});
  const void* pa = w.get("a");
  runtime::DeviceWeights moved = std::move(w);
  CHECK(moved.get("a") == pa);
  CHECK(w.find("a") == nullptr);
  std::vector<uint8_t> got = download(moved, "b");
  CHECK(std::string(got.begin(), got.end()) == std::string(500, 'x'));
  std::string err;
  try {
    moved.get("c");
  } catch (const Error& e) {
    err = e.what();
  }
  CHECK(err.find("no weight named 'c'") != std::string::npos);
}
