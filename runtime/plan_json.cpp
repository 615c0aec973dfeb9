// launch_table_to_json / launch_table_from_json: the launch table's plan.json form.
#include "runtime/plan_json.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "base/error.h"

namespace xserv::runtime {

namespace {

using K = LaunchArg::Kind;
using json = nlohmann::json;

/// Argument kinds by their JSON tag.
constexpr std::pair<K, const char*> kTags[] = {
    {K::Null, "null"}, {K::Activation, "a"},  {K::Weight, "w"},
    {K::Cache, "c"},   {K::Param, "p"},       {K::Scratch, "s"},
    {K::Rows, "rows"}, {K::Splits, "splits"}, {K::Int, "int"},
};

const char* tag(K k) {
  for (const auto& [kind, t] : kTags)
    if (kind == k)
      return t;
  throw Error("launch table: unknown argument kind");
}

/// An argument as one string, "KIND[:ID][@OFFSET][+r*STRIDE]": "a@4096" (activation),
/// "w:NAME", "c:2", "p:positions", "s:5", "a@0+r*256" (chunked), "rows", "splits", "int:7",
/// "null". One string per argument keeps plan.json's indented form small.
json arg_to_json(const LaunchArg& a) {
  std::string s = tag(a.kind);
  switch (a.kind) {
  case K::Weight:
  case K::Param:
    s += ":" + a.name;
    break;
  case K::Cache:
  case K::Scratch:
    s += fmt::format(":{}", a.index);
    break;
  case K::Int:
    s += fmt::format(":{}", a.value);
    break;
  default:
    break;
  }
  if (a.kind == K::Activation || a.offset)
    s += fmt::format("@{}", a.offset);
  if (a.row_stride)
    s += fmt::format("+r*{}", a.row_stride);
  return s;
}

LaunchArg arg_from_json(const json& j) {
  if (!j.is_string())
    throw Error("launch table: an argument is not a string: " + j.dump());
  std::string s = j.get<std::string>();
  LaunchArg a;
  const auto number = [&](const std::string& text) -> uint64_t {
    try {
      size_t used = 0;
      const uint64_t v = std::stoull(text, &used);
      if (used == text.size())
        return v;
    } catch (const std::exception&) {
    }
    throw Error(
        fmt::format("launch table: bad number '{}' in argument '{}'", text, j.get<std::string>()));
  };
  if (const size_t at = s.rfind("+r*"); at != std::string::npos) {
    a.row_stride = number(s.substr(at + 3));
    s.resize(at);
  }
  if (const size_t at = s.rfind('@'); at != std::string::npos) {
    a.offset = number(s.substr(at + 1));
    s.resize(at);
  }
  const size_t colon = s.find(':');
  const std::string t = s.substr(0, colon),
                    id = colon == std::string::npos ? "" : s.substr(colon + 1);
  bool found = false;
  for (const auto& [kind, name] : kTags)
    if (t == name) {
      a.kind = kind;
      found = true;
    }
  if (!found)
    throw Error(fmt::format("launch table: unknown argument kind '{}'", t));
  switch (a.kind) {
  case K::Weight:
  case K::Param:
    a.name = id;
    break;
  case K::Cache:
  case K::Scratch:
    a.index = static_cast<int>(number(id));
    break;
  case K::Int: {
    const bool negative = !id.empty() && id[0] == '-';
    const uint64_t magnitude = number(negative ? id.substr(1) : id);
    if (magnitude > (negative ? uint64_t{1} << 31 : (uint64_t{1} << 31) - 1))
      throw Error(
          fmt::format("launch table: int argument '{}' is outside 32 bits", j.get<std::string>()));
    a.value = static_cast<int>(negative ? -static_cast<int64_t>(magnitude)
                                        : static_cast<int64_t>(magnitude));
    break;
  }
  default:
    break;
  }
  return a;
}

template <typename T> void get_opt(const json& j, const char* key, T& out) {
  if (auto it = j.find(key); it != j.end())
    out = it->get<T>();
}

json launch_to_json(const PlanLaunch& l) {
  json j = {{"k", l.kernel}, {"label", l.label}};
  if (l.library >= 0)
    j["library"] = l.library;
  if (l.seq_rows)
    j["seq_rows"] = true;
  if (l.min_rows)
    j["min_rows"] = l.min_rows;
  if (l.max_rows != -1)
    j["max_rows"] = l.max_rows;
  if (l.chunk)
    j["chunk"] = l.chunk;
  if (l.splits_window >= 0)
    j["splits_window"] = l.splits_window;
  if (l.min_splits != 1)
    j["min_splits"] = l.min_splits;
  if (l.splits_heads != 0)
    j["splits_heads"] = l.splits_heads;
  if (l.split_chunk != 0)
    j["split_chunk"] = l.split_chunk;
  if (l.one_per_seq != 0)
    j["one_per_seq"] = l.one_per_seq;
  if (l.part != 0)
    j["part"] = l.part;
  json args = json::array();
  for (const LaunchArg& a : l.args)
    args.push_back(arg_to_json(a));
  j["args"] = std::move(args);
  return j;
}

PlanLaunch launch_from_json(const json& l) {
  PlanLaunch p;
  p.kernel = l.at("k").get<int>();
  p.label = l.at("label").get<std::string>();
  get_opt(l, "library", p.library);
  get_opt(l, "seq_rows", p.seq_rows);
  get_opt(l, "min_rows", p.min_rows);
  get_opt(l, "max_rows", p.max_rows);
  get_opt(l, "chunk", p.chunk);
  get_opt(l, "splits_window", p.splits_window);
  get_opt(l, "min_splits", p.min_splits);
  get_opt(l, "splits_heads", p.splits_heads);
  get_opt(l, "split_chunk", p.split_chunk);
  get_opt(l, "one_per_seq", p.one_per_seq);
  get_opt(l, "part", p.part);
  for (const json& a : l.at("args"))
    p.args.push_back(arg_from_json(a));
  return p;
}

} // namespace

json launch_table_to_json(const LaunchTable& t) {
  json kernels = json::array();
  for (const PlanKernel& k : t.kernels) {
    json j = {{"name", k.name}, {"block", k.block}, {"blocks_x", k.blocks_x}};
    if (k.y_per_token)
      j["y_per_token"] = k.y_per_token;
    if (k.z_splits)
      j["z_splits"] = true;
    if (k.blocks_z != 1)
      j["blocks_z"] = k.blocks_z;
    if (k.y_tile)
      j["y_tile"] = k.y_tile;
    if (k.y_extra)
      j["y_extra"] = k.y_extra;
    if (k.smem_per_row)
      j["smem_per_row"] = k.smem_per_row;
    if (k.smem_fixed)
      j["smem_fixed"] = k.smem_fixed;
    kernels.push_back(std::move(j));
  }
  json library = json::array();
  for (const PlanLibraryCall& c : t.library) {
    json j = {{"op", "gemm_bf16"}, {"n", c.n}, {"k", c.k}};
    if (c.accumulate)
      j["accumulate"] = true;
    if (c.fixed_rows > 0) // tables of other plans read as before
      j["fixed_rows"] = c.fixed_rows;
    library.push_back(std::move(j));
  }
  json launches = json::array();
  for (const PlanLaunch& l : t.launches)
    launches.push_back(launch_to_json(l));
  json scratch = json::array();
  for (const ScratchBuffer& s : t.scratch) {
    json j = {{"bytes", s.bytes}};
    if (!s.f64.empty())
      j["f64"] = s.f64;
    scratch.push_back(std::move(j));
  }
  json out = {{"kernels", std::move(kernels)},
              {"launches", std::move(launches)},
              {"scratch", std::move(scratch)},
              {"argmax_scratch", t.argmax_scratch},
              {"argmax_chunks", t.argmax_chunks}};
  if (!library.empty()) // plans without library calls read as before
    out["library"] = std::move(library);
  if (!t.masked_pick.empty()) { // nor do those without the masked pick
    json masked = json::array();
    for (const PlanLaunch& l : t.masked_pick)
      masked.push_back(launch_to_json(l));
    out["masked_pick"] = std::move(masked);
    out["mask_scratch"] = t.mask_scratch;
    out["mask_rows_scratch"] = t.mask_rows_scratch;
    out["mask_words"] = t.mask_words;
  }
  return out;
}

LaunchTable launch_table_from_json(const json& j) {
  LaunchTable t;
  std::string at = "the table"; // the part being read, for messages
  try {
    for (const json& k : j.at("kernels")) {
      at = fmt::format("kernels[{}]", t.kernels.size());
      PlanKernel p;
      p.name = k.at("name").get<std::string>();
      p.block = k.at("block").get<int>();
      p.blocks_x = k.at("blocks_x").get<int>();
      get_opt(k, "y_per_token", p.y_per_token);
      get_opt(k, "z_splits", p.z_splits);
      get_opt(k, "blocks_z", p.blocks_z);
      get_opt(k, "y_tile", p.y_tile);
      get_opt(k, "y_extra", p.y_extra);
      get_opt(k, "smem_per_row", p.smem_per_row);
      get_opt(k, "smem_fixed", p.smem_fixed);
      t.kernels.push_back(std::move(p));
    }
    if (auto lib = j.find("library"); lib != j.end())
      for (const json& c : *lib) {
        at = fmt::format("library[{}]", t.library.size());
        PlanLibraryCall p;
        if (c.at("op").get<std::string>() != "gemm_bf16")
          throw Error(fmt::format("launch table: {}.op \"{}\" is not a library routine this "
                                  "runtime knows (gemm_bf16)",
                                  at, c.at("op").get<std::string>()));
        p.n = c.at("n").get<int>();
        p.k = c.at("k").get<int>();
        get_opt(c, "accumulate", p.accumulate);
        get_opt(c, "fixed_rows", p.fixed_rows);
        if (p.n < 1 || p.k < 1)
          throw Error(fmt::format("launch table: {} is a {} x {} gemm", at, p.n, p.k));
        if (p.fixed_rows < 0 || p.fixed_rows > (1 << 24))
          throw Error(
              fmt::format("launch table: {}.fixed_rows {} is outside [0, 2^24]", at, p.fixed_rows));
        t.library.push_back(p);
      }
    for (const json& l : j.at("launches")) {
      at = fmt::format("launches[{}]", t.launches.size());
      t.launches.push_back(launch_from_json(l));
    }
    if (j.contains("masked_pick"))
      for (const json& l : j.at("masked_pick")) {
        at = fmt::format("masked_pick[{}]", t.masked_pick.size());
        t.masked_pick.push_back(launch_from_json(l));
      }
    for (const json& s : j.at("scratch")) {
      at = fmt::format("scratch[{}]", t.scratch.size());
      ScratchBuffer b;
      b.bytes = s.at("bytes").get<uint64_t>();
      get_opt(s, "f64", b.f64);
      t.scratch.push_back(std::move(b));
    }
    at = "the table";
    t.argmax_scratch = j.at("argmax_scratch").get<int>();
    t.argmax_chunks = j.at("argmax_chunks").get<int>();
    get_opt(j, "mask_scratch", t.mask_scratch);
    get_opt(j, "mask_rows_scratch", t.mask_rows_scratch);
    get_opt(j, "mask_words", t.mask_words);
  } catch (const json::exception& e) {
    // nlohmann's text without its "[json.exception.KIND.N] " tag, after the part it is about.
    std::string what = e.what();
    if (const size_t close = what.find("] ");
        what.rfind("[json.exception", 0) == 0 && close != std::string::npos)
      what = what.substr(close + 2);
    throw Error(fmt::format("launch table in plan.json is malformed: {}: {}", at, what));
  }
  // Kernel names become file names (kernels/NAME.cubin): identifiers only, never a path.
  for (size_t i = 0; i < t.kernels.size(); ++i) {
    const std::string& n = t.kernels[i].name;
    const bool ident = !n.empty() && std::all_of(n.begin(), n.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
    });
    if (!ident)
      throw Error(fmt::format("launch table: kernels[{}].name \"{}\" is not a kernel name "
                              "(letters, digits and _)",
                              i, n));
  }
  for (size_t i = 0; i < t.launches.size(); ++i) {
    const PlanLaunch& l = t.launches[i];
    if (l.library != -1) {
      if (l.library < 0 || static_cast<size_t>(l.library) >= t.library.size() || l.kernel != -1)
        throw Error(fmt::format("launch table: launches[{}] calls library[{}] (k {}), but there "
                                "are {} library calls and such a launch has k -1",
                                i, l.library, l.kernel, t.library.size()));
      if (l.args.size() != 3)
        throw Error(fmt::format("launch table: launches[{}] calls a gemm with {} arguments, "
                                "not 3 (x, w, y)",
                                i, l.args.size()));
      continue;
    }
    if (l.kernel < 0 || static_cast<size_t>(l.kernel) >= t.kernels.size())
      throw Error(fmt::format("launch table: launches[{}].k is {}, outside the {} kernels", i,
                              l.kernel, t.kernels.size()));
  }
  for (size_t i = 0; i < t.masked_pick.size(); ++i) {
    const PlanLaunch& l = t.masked_pick[i];
    if (l.library != -1 || l.kernel < 0 || static_cast<size_t>(l.kernel) >= t.kernels.size())
      throw Error(fmt::format("launch table: masked_pick[{}] launches kernel {} (library {}); "
                              "it takes one of the {} kernels",
                              i, l.kernel, l.library, t.kernels.size()));
  }
  if (!t.masked_pick.empty()) {
    const auto scratch = [&](int index, const char* field) {
      if (index < 0 || static_cast<size_t>(index) >= t.scratch.size())
        throw Error(fmt::format("launch table: {} is {}, outside the {} scratch buffers", field,
                                index, t.scratch.size()));
    };
    scratch(t.mask_scratch, "mask_scratch");
    scratch(t.mask_rows_scratch, "mask_rows_scratch");
    if (t.mask_words < 1)
      throw Error(fmt::format("launch table: mask_words is {}, and a masked pick needs at least 1",
                              t.mask_words));
  }
  return t;
}

} // namespace xserv::runtime
