// The gpt-oss HF tensor layout (MODEL.md "Tensors") and checking a checkpoint against it.
#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>

#include "base/error.h"
#include "models/checkpoint.h"
#include "models/mxfp4.h"

namespace xserv::models {
namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

constexpr std::string_view kBlocks = "_blocks", kScales = "_scales";

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

} // namespace

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c) {
  std::vector<ExpectedTensor> out;
  auto add = [&](std::string name, const char* dtype, std::vector<int64_t> shape) {
    out.push_back({std::move(name), dtype, std::move(shape)});
  };
  const int64_t h = c.hidden_size, q = c.q_width(), kv = c.kv_width(), e = c.num_local_experts;
  const int64_t inter = c.intermediate_size;
  add("model.embed_tokens.weight", "BF16", {c.vocab_size, h});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    std::string p = fmt::format("model.layers.{}.", l);
    add(p + "input_layernorm.weight", "BF16", {h});
    add(p + "post_attention_layernorm.weight", "BF16", {h});
    for (auto [proj, rows] : {std::pair{"q_proj", q}, {"k_proj", kv}, {"v_proj", kv}}) {
      add(p + "self_attn." + proj + ".weight", "BF16", {rows, h});
      add(p + "self_attn." + proj + ".bias", "BF16", {rows});
    }
    add(p + "self_attn.o_proj.weight", "BF16", {h, q});
    add(p + "self_attn.o_proj.bias", "BF16", {h});
    add(p + "self_attn.sinks", "BF16", {c.num_attention_heads});
    add(p + "mlp.router.weight", "BF16", {e, h});
    add(p + "mlp.router.bias", "BF16", {e});
    for (auto [proj, rows, cols] :
         {std::tuple{"gate_up_proj", 2 * inter, h}, std::tuple{"down_proj", h, inter}}) {
      std::string base = p + "mlp.experts." + proj;
      add(base + "_blocks", "U8", {e, rows, cols / kMxfp4BlockValues, kMxfp4BlockBytes});
      add(base + "_scales", "U8", {e, rows, cols / kMxfp4BlockValues});
      add(base + "_bias", "BF16", {e, rows});
    }
  }
  add("model.norm.weight", "BF16", {h});
  add("lm_head.weight", "BF16", {c.vocab_size, h});
  return out;
}

std::vector<std::string> Checkpoint::problems(const ModelConfig& config) const {
  std::vector<std::string> out;
  std::set<std::string> expected_names;
  auto where = [&](const std::string& name) { return file_of(name).filename().string(); };
  for (const ExpectedTensor& want : expected_tensors(config)) {
    expected_names.insert(want.name);
    const TensorInfo* t = find(want.name);
    if (!t) {
      if (std::find(index_broken_.begin(), index_broken_.end(), want.name) == index_broken_.end())
        out.push_back(fmt::format("missing tensor {}: expected {} {}", want.name, want.dtype,
                                  shape_str(want.shape)));
      continue;
    }
    if (t->dtype != want.dtype)
      out.push_back(fmt::format("{} in {}: dtype {}, expected {}", want.name, where(want.name),
                                t->dtype, want.dtype));
    if (t->shape != want.shape)
      out.push_back(fmt::format("{} in {}: shape {}, expected {}", want.name, where(want.name),
                                shape_str(t->shape), shape_str(want.shape)));
  }
  // Pairs are checked on what the files hold, so a consistent pair of the wrong size is
  // reported only as a shape problem and a disagreeing pair is named as such.
  std::vector<std::string> names = tensor_names();
  for (const std::string& name : names) {
    if (!ends_with(name, kBlocks))
      continue;
    std::string scales_name = name.substr(0, name.size() - kBlocks.size()) + std::string(kScales);
    const TensorInfo& b = info(name);
    const TensorInfo* s = find(scales_name);
    if (!s)
      continue; // reported as missing (or unexpected) above
    std::vector<int64_t> want(b.shape.begin(), b.shape.end() - (b.shape.empty() ? 0 : 1));
    if (b.shape.empty() || b.shape.back() != kMxfp4BlockBytes || s->shape != want)
      out.push_back(fmt::format("MXFP4 pair disagrees: {} {} in {} and {} {} in {}: the scales "
                                "must have the blocks' shape without its last dimension of {}",
                                name, shape_str(b.shape), where(name), scales_name,
                                shape_str(s->shape), where(scales_name), kMxfp4BlockBytes));
  }
  for (const std::string& name : names)
    if (!expected_names.count(name))
      out.push_back(fmt::format("unexpected tensor {} ({} {}) in {}: not part of the gpt-oss "
                                "layout for this config",
                                name, info(name).dtype, shape_str(info(name).shape), where(name)));
  return out;
}

void Checkpoint::validate(const ModelConfig& config) const {
  std::vector<std::string> p = problems(config);
  if (!p.empty())
    fail("does not match the gpt-oss tensor layout", p);
}

void Checkpoint::fail(const std::string& what, const std::vector<std::string>& problems) const {
  std::string msg = fmt::format("{}: checkpoint {} ({} problem{}):", dir_.string(), what,
                                problems.size(), problems.size() == 1 ? "" : "s");
  for (const std::string& p : problems)
    msg += "\n  - " + p;
  throw Error(msg);
}

} // namespace xserv::models
