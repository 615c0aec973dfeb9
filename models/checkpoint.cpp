// Opening a checkpoint directory (single file or shards + index) and reading its tensors.
//
// open():
//   1. ModelConfig::load(dir/config.json);
//   2. model.safetensors if present (what transformers prefers), else the index: every shard it
//      names is opened, each weight_map entry must be in its shard, and every shard tensor must
//      be in the index, mapped to that shard;
//   3. with options.validate, problems(config) joins the index problems in the one Error.
#include "models/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "models/bf16.h"
#include "models/mxfp4.h"

namespace xserv::models {
namespace fs = std::filesystem;

namespace {

SafetensorsFile open_file(const fs::path& path, bool map) {
  return map ? SafetensorsFile::open(path) : SafetensorsFile::read_header_only(path);
}

} // namespace

Checkpoint Checkpoint::open(const fs::path& dir, CheckpointOptions options) {
  if (!fs::is_directory(dir))
    throw Error(fmt::format("{}: not a checkpoint directory (expected a directory holding "
                            "config.json and safetensors files)",
                            dir.string()));
  Checkpoint ck;
  ck.dir_ = dir;
  ck.options_ = options;
  ck.config_ = ModelConfig::load(dir / "config.json");
  std::vector<std::string> problems;
  fs::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
  if (fs::exists(single)) {
    ck.files_.push_back(open_file(single, options.map_data));
    for (size_t i = 0; i < ck.files_[0].tensors().size(); ++i)
      ck.tensors_.emplace(ck.files_[0].tensors()[i].name, Location{0, i});
  } else if (fs::exists(index)) {
    problems = ck.index_problems(index);
  } else {
    throw Error(fmt::format("{}: no model.safetensors or model.safetensors.index.json in the "
                            "checkpoint directory",
                            dir.string()));
  }
  if (options.validate) {
    std::vector<std::string> layout = ck.problems(ck.config_);
    problems.insert(problems.end(), layout.begin(), layout.end());
  }
  if (!problems.empty())
    ck.fail("is invalid", problems);
  return ck;
}

std::vector<std::string> Checkpoint::index_problems(const fs::path& index_path) {
  using nlohmann::json;
  std::string name = index_path.filename().string();
  std::ifstream in(index_path);
  std::stringstream ss;
  ss << in.rdbuf();
  json doc = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (!in || doc.is_discarded())
    throw Error(fmt::format("{}: not valid JSON", index_path.string()));
  auto wm = doc.is_object() ? doc.find("weight_map") : doc.end();
  if (wm == doc.end() || !wm->is_object())
    throw Error(fmt::format("{}: missing object 'weight_map' (tensor name -> shard file)",
                            index_path.string()));
  std::vector<std::string> problems;
  std::map<std::string, std::vector<std::string>> by_shard; // sorted: a stable file order
  for (const auto& [tensor, shard] : wm->items()) {
    if (!shard.is_string()) {
      problems.push_back(fmt::format("{}: weight_map[\"{}\"] must be a file name, found {}", name,
                                     tensor, shard.dump()));
      continue;
    }
    by_shard[shard.get<std::string>()].push_back(tensor);
  }
  for (auto& [shard, names] : by_shard) {
    // Shard names are plain file names: an index must not reach outside its directory.
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..") {
      problems.push_back(
          fmt::format("{} names shard '{}', which is not a plain file name", name, shard));
      index_broken_.insert(index_broken_.end(), names.begin(), names.end());
      continue;
    }
    fs::path path = dir_ / shard;
    if (!fs::exists(path)) {
      problems.push_back(fmt::format("{} names shard {} (for {} tensor{}, e.g. {}), which does "
                                     "not exist",
                                     name, shard, names.size(), names.size() == 1 ? "" : "s",
                                     names.front()));
      index_broken_.insert(index_broken_.end(), names.begin(), names.end());
      continue;
    }
    try {
      files_.push_back(open_file(path, options_.map_data));
    } catch (const Error& e) {
      problems.push_back(e.what());
      index_broken_.insert(index_broken_.end(), names.begin(), names.end());
      continue;
    }
    size_t f = files_.size() - 1;
    for (const std::string& tensor : names) {
      if (files_[f].find(tensor))
        continue;
      problems.push_back(
          fmt::format("{} maps {} to {}, which does not hold it", name, tensor, shard));
      index_broken_.push_back(tensor);
    }
  }
  for (size_t f = 0; f < files_.size(); ++f) {
    std::string shard = files_[f].path().filename().string();
    for (size_t i = 0; i < files_[f].tensors().size(); ++i) {
      const std::string& tensor = files_[f].tensors()[i].name;
      auto it = wm->find(tensor);
      if (it == wm->end()) {
        problems.push_back(fmt::format("tensor {} in {} is missing from {}", tensor, shard, name));
        tensors_.emplace(tensor, Location{f, i}); // readable: the layout check need not repeat it
      } else if (*it != shard) {
        problems.push_back(fmt::format("tensor {} is also in {}, but {} maps it to {}", tensor,
                                       shard, name, it->dump()));
      } else {
        tensors_.emplace(tensor, Location{f, i});
      }
    }
  }
  return problems;
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, loc] : tensors_)
    names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

const TensorInfo* Checkpoint::find(std::string_view name) const {
  auto it = tensors_.find(std::string(name));
  return it == tensors_.end() ? nullptr : &files_[it->second.file].tensors()[it->second.tensor];
}

const TensorInfo& Checkpoint::info(std::string_view name) const {
  if (const TensorInfo* t = find(name))
    return *t;
  throw Error(fmt::format("{}: checkpoint has no tensor {}", dir_.string(), name));
}

const fs::path& Checkpoint::file_of(std::string_view name) const {
  info(name);
  return files_[tensors_.at(std::string(name)).file].path();
}

std::span<const uint8_t> Checkpoint::bytes(std::string_view name) const {
  const TensorInfo& t = info(name);
  return files_[tensors_.at(std::string(name)).file].bytes(t);
}

int Checkpoint::max_mxfp4_scale() const {
  int most = -1;
  for (const std::string& name : tensor_names()) {
    if (!name.ends_with("_scales") || info(name).dtype != "U8")
      continue;
    uint8_t m = 0;
    for (const uint8_t b : bytes(name))
      m = std::max(m, b);
    most = std::max(most, int(m));
  }
  return most;
}

std::vector<float> Checkpoint::read_bf16(std::string_view name) const {
  const TensorInfo& t = info(name);
  if (t.dtype != "BF16")
    throw Error(
        fmt::format("{}: tensor {} is {}, expected BF16", file_of(name).string(), name, t.dtype));
  std::span<const uint8_t> b = bytes(name);
  std::vector<float> out(b.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    const auto bits = static_cast<uint16_t>(b[2 * i] | (b[2 * i + 1] << 8));
    if ((bits & 0x7F80) == 0x7F80)
      throw Error(fmt::format("{}: tensor {} element {} is {}: the checkpoint holds non-finite "
                              "weights",
                              file_of(name).string(), name, i,
                              (bits & 0x7F) != 0 ? "NaN" : "infinite"));
    out[i] = bf16_to_float(bits);
  }
  return out;
}

Mxfp4Tensor Checkpoint::mxfp4(std::string_view base) const {
  std::string bn = std::string(base) + "_blocks", sn = std::string(base) + "_scales";
  const TensorInfo &b = info(bn), &s = info(sn);
  bool ok = b.dtype == "U8" && s.dtype == "U8" && b.shape.size() == 4 && s.shape.size() == 3 &&
            b.shape[3] == kMxfp4BlockBytes &&
            std::equal(s.shape.begin(), s.shape.end(), b.shape.begin());
  if (!ok)
    throw Error(fmt::format("{}: {} ({}) and {} ({}) are not an MXFP4 pair (U8 [E, rows, G, 16] "
                            "and U8 [E, rows, G])",
                            dir_.string(), bn, b.dtype, sn, s.dtype));
  Mxfp4Tensor m;
  m.base = base;
  m.experts = b.shape[0];
  m.rows = b.shape[1];
  m.cols = b.shape[2] * kMxfp4BlockValues;
  m.blocks = bytes(bn);
  m.scales = bytes(sn);
  return m;
}

void Mxfp4Tensor::decode_expert(int64_t e, std::span<float> out) const {
  XSERV_CHECK(e >= 0 && e < experts, fmt::format("expert {} of {} in {}", e, experts, base));
  auto per = static_cast<size_t>(rows * (cols / kMxfp4BlockValues)), i = static_cast<size_t>(e);
  mxfp4_decode_matrix(blocks.subspan(i * per * kMxfp4BlockBytes, per * kMxfp4BlockBytes),
                      scales.subspan(i * per, per), rows, cols, out);
}

void Checkpoint::decode_checked(const Mxfp4Tensor& m, int64_t e, std::span<float> out) const {
  const auto per = static_cast<size_t>(m.rows * (m.cols / kMxfp4BlockValues));
  const std::span<const uint8_t> scales = m.scales.subspan(static_cast<size_t>(e) * per, per);
  if (const auto hit = std::find(scales.begin(), scales.end(), uint8_t{0xFF}); hit != scales.end())
    throw Error(fmt::format("{}: tensor {}_scales holds scale byte 0xFF (E8M0 NaN) at index {}: "
                            "the checkpoint is corrupt",
                            file_of(m.base + "_scales").string(), m.base,
                            static_cast<size_t>(e) * per + size_t(hit - scales.begin())));
  m.decode_expert(e, out);
  for (size_t i = 0; i < out.size(); ++i)
    if (!std::isfinite(out[i]))
      throw Error(fmt::format("{}: tensor {} expert {} element {} is infinite after MXFP4 "
                              "decoding (a scale byte too large for its values): the checkpoint "
                              "holds non-finite weights",
                              file_of(m.base + "_blocks").string(), m.base, e, i));
}

std::vector<float> Checkpoint::decode_expert(std::string_view base, int64_t e) const {
  Mxfp4Tensor m = mxfp4(base);
  if (e < 0 || e >= m.experts)
    throw Error(fmt::format("{}: expert {} out of range: {} has {} experts", dir_.string(), e, base,
                            m.experts));
  std::vector<float> out(static_cast<size_t>(m.rows * m.cols));
  decode_checked(m, e, out);
  return out;
}

std::vector<float> Checkpoint::decode_mxfp4(std::string_view base) const {
  Mxfp4Tensor m = mxfp4(base);
  auto per = static_cast<size_t>(m.rows * m.cols);
  std::vector<float> out(per * static_cast<size_t>(m.experts));
  for (int64_t e = 0; e < m.experts; ++e)
    decode_checked(m, e, std::span<float>(out).subspan(static_cast<size_t>(e) * per, per));
  return out;
}

} // namespace xserv::models
