// stage_layout_to_json / stage_layout_from_json: plan.json's "layout", every field checked.
#include "runtime/layout_json.h"

#include <fmt/format.h>

#include "base/error.h"

namespace xserv::runtime {

namespace {

using json = nlohmann::json;

const json& field(const json& j, const char* name, const std::string& where) {
  if (!j.is_object() || !j.contains(name))
    throw Error(fmt::format("layout: {}{} is missing", where, name));
  return j.at(name);
}

int64_t integer(const json& j, const char* name, const std::string& where, int64_t lo, int64_t hi) {
  const json& v = field(j, name, where);
  if (!v.is_number_integer())
    throw Error(fmt::format("layout: {}{} must be an integer", where, name));
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    throw Error(fmt::format("layout: {}{} = {} is outside [{}, {}]", where, name, x, lo, hi));
  return x;
}

bool boolean(const json& j, const char* name, const std::string& where) {
  const json& v = field(j, name, where);
  if (!v.is_boolean())
    throw Error(fmt::format("layout: {}{} must be true or false", where, name));
  return v.get<bool>();
}

std::vector<int64_t> shape(const json& j, const char* name, const std::string& where) {
  const json& v = field(j, name, where);
  if (!v.is_array() || v.empty() || v.size() > 8)
    throw Error(fmt::format("layout: {}{} must be a list of 1 to 8 sizes", where, name));
  std::vector<int64_t> out;
  for (const json& d : v) {
    if (!d.is_number_integer() || d.get<int64_t>() < 1 || d.get<int64_t>() > (int64_t{1} << 40))
      throw Error(fmt::format("layout: {}{} holds a size that is not in [1, 2^40]", where, name));
    out.push_back(d.get<int64_t>());
  }
  return out;
}

constexpr int64_t kMaxBytes = int64_t{1} << 42; // 4 TiB: no H200 arena comes near it

} // namespace

json stage_layout_to_json(const StageLayout& l) {
  json recvs = json::array(), caches = json::array(), weights = json::array();
  for (const auto& r : l.recvs)
    recvs.push_back({{"name", r.name}, {"offset", r.offset}, {"row_bytes", r.row_bytes}});
  for (const auto& c : l.caches)
    caches.push_back(
        {{"block_shape", c.block_shape}, {"elem_bytes", c.elem_bytes}, {"window", c.window}});
  for (const auto& w : l.weights)
    weights.push_back({{"name", w.name}, {"shape", w.shape}});
  json j = {{"max_batch", l.max_batch},
            {"max_seq", l.max_seq},
          {"tokens", l.tokens},
          {"gemm_split", l.gemm_split},
          {"expert_format", expert_format_name(l.expert_format)},
          {"arena_bytes", l.arena_bytes},
          {"output",
           {{"offset", l.output.offset},
            {"row_bytes", l.output.row_bytes},
            {"per_token", l.output.per_token},
            {"sends", l.output.sends},
            {"vocab", l.output.vocab}}},
          {"recvs", recvs},
          {"kv_block", l.kv_block},
          {"table_blocks", l.table_blocks},
          {"window", l.window},
          {"caches", caches},
          {"weights", weights}};
  if (l.mxfp4_max_scale >= 0) // layouts whose kernels take any scale read as before
    j["mxfp4_max_scale"] = l.mxfp4_max_scale;
  return j;
}

StageLayout stage_layout_from_json(const json& j) {
  StageLayout l;
  l.max_batch = integer(j, "max_batch", "", 1, 1 << 20);
  l.max_seq = integer(j, "max_seq", "", 1, int64_t{1} << 24);
  l.tokens = integer(j, "tokens", "", 1, 1 << 24);
  l.gemm_split = boolean(j, "gemm_split", "");
  {
    const json& f = field(j, "expert_format", "");
    if (!f.is_string() || !parse_expert_format(f.get<std::string>(), l.expert_format))
      throw Error("layout: expert_format must be \"bf16\", \"mxfp4\" or \"both\"");
  }
  if (j.contains("mxfp4_max_scale"))
    l.mxfp4_max_scale = static_cast<int>(integer(j, "mxfp4_max_scale", "", 0, 128));
  l.arena_bytes = uint64_t(integer(j, "arena_bytes", "", 1, kMaxBytes));
  const json& o = field(j, "output", "");
  l.output.offset = uint64_t(integer(o, "offset", "output.", 0, kMaxBytes));
  l.output.row_bytes = uint64_t(integer(o, "row_bytes", "output.", 4, kMaxBytes));
  l.output.per_token = boolean(o, "per_token", "output.");
  l.output.sends = boolean(o, "sends", "output.");
  l.output.vocab = integer(o, "vocab", "output.", 1, int64_t{1} << 24);
  const uint64_t out_rows = uint64_t(l.output.per_token || l.output.sends ? l.tokens : l.max_batch);
  if (l.output.offset + out_rows * l.output.row_bytes > l.arena_bytes)
    throw Error(fmt::format("layout: output ({} rows of {} bytes at {}) ends past the arena of "
                            "{} bytes",
                            out_rows, l.output.row_bytes, l.output.offset, l.arena_bytes));
  for (const json& r : field(j, "recvs", "")) {
    StageLayout::Recv rv;
    const json& name = field(r, "name", "recvs[].");
    if (!name.is_string() || name.get<std::string>().empty())
      throw Error("layout: recvs[].name must be a non-empty string");
    rv.name = name.get<std::string>();
    rv.offset = uint64_t(integer(r, "offset", "recvs[].", 0, kMaxBytes));
    rv.row_bytes = uint64_t(integer(r, "row_bytes", "recvs[].", 4, kMaxBytes));
    if (rv.offset + uint64_t(l.tokens) * rv.row_bytes > l.arena_bytes)
      throw Error(fmt::format("layout: recv '{}' ends past the arena", rv.name));
    l.recvs.push_back(std::move(rv));
  }
  l.kv_block = integer(j, "kv_block", "", 1, 1024);
  if ((l.kv_block & (l.kv_block - 1)) != 0)
    throw Error(fmt::format("layout: kv_block = {} is not a power of two", l.kv_block));
  l.table_blocks = integer(j, "table_blocks", "", 1, int64_t{1} << 24);
  if (l.table_blocks != (l.max_seq + l.kv_block - 1) / l.kv_block)
    throw Error(fmt::format("layout: table_blocks = {} is not max_seq {} in blocks of {}",
                            l.table_blocks, l.max_seq, l.kv_block));
  l.window = integer(j, "window", "", 0, int64_t{1} << 24);
  for (const json& c : field(j, "caches", "")) {
    StageLayout::Cache cv;
    cv.block_shape = shape(c, "block_shape", "caches[].");
    cv.elem_bytes = static_cast<int>(integer(c, "elem_bytes", "caches[].", 2, 4));
    cv.window = boolean(c, "window", "caches[].");
    if (cv.block_shape.size() != 3 || cv.block_shape[0] != l.kv_block)
      throw Error(
          fmt::format("layout: a cache's block is not [{}, kv heads, head dim]", l.kv_block));
    if (cv.window && l.window == 0)
      throw Error("layout: a cache pages from the window pool, but the layout has no window");
    l.caches.push_back(std::move(cv));
  }
  for (const json& w : field(j, "weights", "")) {
    StageLayout::Weight wv;
    const json& name = field(w, "name", "weights[].");
    if (!name.is_string() || name.get<std::string>().empty())
      throw Error("layout: weights[].name must be a non-empty string");
    wv.name = name.get<std::string>();
    wv.shape = shape(w, "shape", "weights[].");
    l.weights.push_back(std::move(wv));
  }
  return l;
}

} // namespace xserv::runtime
