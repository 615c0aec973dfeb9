// Reading plan.json into PlanFile: each field's type and range checked once, here, so that the
// commands that run, inspect or replay a plan never meet a raw JSON type error.
#include "cli/plan_file.h"

#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "ir/error.h"
#include "runtime/sha256.h"

namespace xserv::cli {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

enum class Kind { Integer, Number, String, Bool, Object, Array };

const char* kind_name(Kind k) {
  switch (k) {
  case Kind::Integer:
    return "an integer";
  case Kind::Number:
    return "a number";
  case Kind::String:
    return "a string";
  case Kind::Bool:
    return "true or false";
  case Kind::Object:
    return "an object";
  case Kind::Array:
    return "a list";
  }
  return "?";
}

bool is_kind(const json& v, Kind k) {
  switch (k) {
  case Kind::Integer:
    return v.is_number_integer();
  case Kind::Number:
    return v.is_number();
  case Kind::String:
    return v.is_string();
  case Kind::Bool:
    return v.is_boolean();
  case Kind::Object:
    return v.is_object();
  case Kind::Array:
    return v.is_array();
  }
  return false;
}

/// A JSON value in a message: short, so a huge field cannot flood the terminal.
std::string shown(const json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

/// Field access that names `plan.file` and the dotted field path in every error.
class Checker {
public:
  explicit Checker(const PlanFile& plan) : plan_(plan) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw Error(plan_.field_error(field, what));
  }

  /// obj[key] checked to be of `kind`; nullptr when absent and not required.
  const json* get(const json& obj, const std::string& path, const char* key, Kind kind,
                  bool required) const {
    const std::string field = path.empty() ? key : path + "." + key;
    auto it = obj.find(key);
    if (it == obj.end()) {
      if (required)
        fail(field, "missing");
      return nullptr;
    }
    if (!is_kind(*it, kind))
      fail(field, fmt::format("expected {}, found {}", kind_name(kind), shown(*it)));
    return &*it;
  }

  int64_t integer(const json& obj, const std::string& path, const char* key, int64_t lo, int64_t hi,
                  bool required, int64_t fallback) const {
    const json* v = get(obj, path, key, Kind::Integer, required);
    if (!v)
      return fallback;
    const std::string field = path.empty() ? key : path + "." + key;
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX))
      fail(field, fmt::format("must be in [{}, {}], found {}", lo, hi, shown(*v)));
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi)
      fail(field, fmt::format("must be in [{}, {}], found {}", lo, hi, x));
    return x;
  }

  std::string string(const json& obj, const std::string& path, const char* key, bool required,
                     std::string fallback = {}) const {
    const json* v = get(obj, path, key, Kind::String, required);
    return v ? v->get<std::string>() : fallback;
  }

  /// A path inside the directory it is joined to.
  std::string relative_path(const json& obj, const std::string& path, const char* key,
                            bool required, std::string fallback = {}) const {
    std::string p = string(obj, path, key, required, std::move(fallback));
    if (!confined_path(p))
      fail(path.empty() ? key : path + "." + key,
           fmt::format("\"{}\" is not a path inside the {} directory", p,
                       path.rfind("weights", 0) == 0 ? "checkpoint" : "plan"));
    return p;
  }

  /// Each listed key of obj, when present, is of its kind (display-only fields).
  void kinds(const json& obj, const std::string& path,
             std::initializer_list<std::pair<const char*, Kind>> keys) const {
    for (const auto& [key, kind] : keys)
      get(obj, path, key, kind, false);
  }

private:
  const PlanFile& plan_;
};

void read_options(const Checker& c, PlanFile& p) {
  const json& o = *c.get(p.doc, "", "options", Kind::Object, true);
  p.max_batch = c.integer(o, "options", "max_batch", 1, kPlanMaxBatch, true, 1);
  p.max_seq = c.integer(o, "options", "max_seq", 1, kPlanMaxSeq, true, 1);
  p.pp = c.integer(o, "options", "pp", 1, kPlanMaxStages, false, 1);
  p.prefill_chunk = c.integer(o, "options", "prefill_chunk", 1, kPlanMaxSeq, false, 0);
  if (const json* v = c.get(o, "options", "last_logits_only", Kind::Bool, false))
    p.last_logits_only = v->get<bool>();
  p.kv_dtype = c.string(o, "options", "kv_dtype", false, "f32");
  if (p.kv_dtype != "f32" && p.kv_dtype != "bf16")
    c.fail("options.kv_dtype",
           fmt::format("must be \"f32\" or \"bf16\", found \"{}\"", p.kv_dtype));
  p.arch = c.string(o, "options", "arch", false);
}

void read_pipeline(const Checker& c, PlanFile& p) {
  const json* pl = c.get(p.doc, "", "pipeline", Kind::Object, false);
  if (!pl) {
    if (p.pp != 1)
      c.fail("pipeline", fmt::format("missing, but options.pp is {}", p.pp));
    return;
  }
  c.kinds(*pl, "pipeline", {{"imbalance", Kind::Number}});
  const json& stages = *c.get(*pl, "pipeline", "stages", Kind::Array, true);
  if (static_cast<int64_t>(stages.size()) != p.pp || stages.size() < 2)
    c.fail("pipeline.stages",
           fmt::format("has {} stages, but options.pp is {} (at least 2)", stages.size(), p.pp));
  for (size_t i = 0; i < stages.size(); ++i) {
    const std::string path = fmt::format("pipeline.stages[{}]", i);
    if (!stages[i].is_object())
      c.fail(path, fmt::format("expected an object, found {}", shown(stages[i])));
    const json& st = stages[i];
    c.integer(st, path, "stage", int64_t(i), int64_t(i), false, 0);
    p.stage_graphs.push_back(c.relative_path(st, path, "graph", true));
    c.kinds(st, path,
            {{"embedding", Kind::Bool},
             {"head", Kind::Bool},
             {"weight_bytes", Kind::Number},
             {"kv_cache_bytes", Kind::Number},
             {"activation_arena_bytes", Kind::Number},
             {"estimated_decode_ms", Kind::Number},
             {"estimated_prefill_us_per_token", Kind::Number},
             {"launches_per_decode_step", Kind::Integer}});
    const json& l = *c.get(st, path, "layers", Kind::Array, true);
    if (l.size() != 2 || !l[0].is_number_integer() || !l[1].is_number_integer())
      c.fail(path + ".layers", fmt::format("expected [FIRST, LAST], found {}", shown(l)));
  }
}

void read_codegen(const Checker& c, PlanFile& p) {
  const json* cg = c.get(p.doc, "", "codegen", Kind::Object, false);
  p.has_codegen = cg != nullptr;
  if (!cg)
    return;
  c.kinds(*cg, "codegen",
          {{"arch", Kind::String},
           {"launches_per_decode_step", Kind::Integer},
           {"launches_per_prefill_step", Kind::Integer},
           {"prefill_step_tokens", Kind::Integer},
           {"arena_tokens", Kind::Integer},
           {"gemm_precision", Kind::String},
           {"arena_bytes", Kind::Integer},
           {"launch_table", Kind::Object}});
  const json* kernels = c.get(*cg, "codegen", "kernels", Kind::Array, true);
  for (size_t i = 0; i < kernels->size(); ++i) {
    const std::string path = fmt::format("codegen.kernels[{}]", i);
    const json& k = (*kernels)[i];
    if (!k.is_object())
      c.fail(path, fmt::format("expected an object, found {}", shown(k)));
    c.kinds(k, path,
            {{"name", Kind::String},
             {"nodes", Kind::Integer},
             {"decode_launches", Kind::Integer},
             {"prefill_launches", Kind::Integer}});
  }
}

std::string sha256_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw Error(fmt::format("{}: missing (plan.json lists it)", file.string()));
  runtime::Sha256 h;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.update(buf.data(), static_cast<size_t>(in.gcount()));
  }
  return h.hex_digest();
}

void read_digests(const Checker& c, PlanFile& p) {
  const json& d = *c.get(p.doc, "", "digests", Kind::Object, true);
  for (auto it = d.begin(); it != d.end(); ++it) {
    const std::string field = "digests." + it.key();
    if (!confined_path(it.key()))
      c.fail(field, "is not a path inside the plan directory");
    if (!it->is_string() || it->get<std::string>().size() != 64)
      c.fail(field, fmt::format("expected a SHA-256 in hex, found {}", shown(*it)));
    p.digests[it.key()] = it->get<std::string>();
  }
  std::vector<std::string> programs = p.stage_graphs;
  programs.push_back(p.graph);
  for (const std::string& f : programs)
    if (!p.digests.count(f))
      c.fail("digests", fmt::format("has no entry for {}", f));
}

} // namespace

void verify_plan_files(const PlanFile& plan) {
  for (const auto& [file, want] : plan.digests) {
    // graph.ir may be deleted: the CUDA runtime replays the launch table without it, and what
    // reads it (the CPU backend, a run the plan does not fit) fails naming it. Changed, never.
    if (file == plan.graph && !std::filesystem::exists(plan.dir / file))
      continue;
    const std::string have = sha256_file(plan.dir / file);
    if (have != want)
      throw Error(fmt::format("{}: changed since the plan was compiled (sha256 {}, {} says {}): "
                              "recompile the plan",
                              (plan.dir / file).string(), have.substr(0, 16), plan.file.string(),
                              want.substr(0, 16)));
  }
  std::error_code ec;
  for (fs::recursive_directory_iterator it(plan.dir / "kernels", ec), end; !ec && it != end;
       it.increment(ec))
    if (!it->is_directory() &&
        !plan.digests.count(fs::relative(it->path(), plan.dir).generic_string()))
      throw Error(fmt::format("{}: not part of the plan as compiled ({} lists no such file): "
                              "remove it or recompile the plan",
                              it->path().string(), plan.file.string()));
}

std::string sampled_file_digest(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw Error(fmt::format("{}: cannot read", file.string()));
  std::error_code ec;
  const uint64_t size = fs::file_size(file, ec);
  runtime::Sha256 h;
  h.update_field(std::to_string(size));
  std::vector<char> buf(64 << 10);
  auto take = [&](uint64_t at, size_t n) {
    in.clear();
    in.seekg(static_cast<std::streamoff>(at));
    in.read(buf.data(), static_cast<std::streamsize>(n));
    h.update_field(std::string_view(buf.data(), static_cast<size_t>(in.gcount())));
  };
  take(0, buf.size());
  constexpr uint64_t kBlock = 4096, kBlocks = 64;
  if (size > buf.size() + kBlock)
    for (uint64_t i = 0; i < kBlocks; ++i)
      take(buf.size() + (size - buf.size() - kBlock) * i / (kBlocks - 1), kBlock);
  return h.hex_digest();
}

std::map<std::string, std::string> digest_plan_files(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename() != "plan.json")
      out[fs::relative(e.path(), dir).generic_string()] = sha256_file(e.path());
  return out;
}

std::string PlanFile::field_error(const std::string& field, const std::string& what) const {
  return fmt::format("{}: field '{}': {}", file.string(), field, what);
}

bool confined_path(const std::string& rel) {
  if (rel.empty())
    return false;
  const fs::path p(rel);
  if (p.is_absolute() || p.has_root_name() || p.has_root_directory())
    return false;
  for (const fs::path& part : p)
    if (part == "..")
      return false;
  return true;
}

PlanFile read_plan_file(const fs::path& dir) {
  PlanFile p;
  p.dir = dir;
  p.file = dir / "plan.json";
  std::ifstream in(p.file, std::ios::binary);
  if (!in)
    throw Error(fmt::format("{}: cannot read", p.file.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  p.doc = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (p.doc.is_discarded())
    throw Error(fmt::format("{}: not valid JSON", p.file.string()));
  if (!p.doc.is_object())
    throw Error(fmt::format("{}: not an xserv plan (expected a JSON object)", p.file.string()));
  const Checker c(p);
  if (const std::string f = c.string(p.doc, "", "format", true); f != "xserv-plan")
    c.fail("format", fmt::format("expected \"xserv-plan\", found \"{}\"", f));
  if (const int64_t v = c.integer(p.doc, "", "version", INT64_MIN, INT64_MAX, true, 0);
      v != kPlanVersion)
    c.fail("version",
           fmt::format("{}, but this xserv reads version {}: recompile the plan", v, kPlanVersion));
  p.model_dir = c.string(p.doc, "", "model_dir", true);
  p.model_digest = c.string(p.doc, "", "model_digest", true);
  if (p.model_digest.empty())
    c.fail("model_digest", "empty (it ties the plan to its checkpoint's config.json)");
  p.config = *c.get(p.doc, "", "config", Kind::Object, true);
  read_options(c, p);
  if (const json* ws = c.get(p.doc, "", "weights", Kind::Array, false))
    for (size_t i = 0; i < ws->size(); ++i) {
      const std::string path = fmt::format("weights[{}]", i);
      if (!(*ws)[i].is_object())
        c.fail(path, fmt::format("expected an object, found {}", shown((*ws)[i])));
      PlanWeightFile w;
      w.file = c.relative_path((*ws)[i], path, "file", true);
      w.bytes = static_cast<uint64_t>(c.integer((*ws)[i], path, "bytes", 0, INT64_MAX, true, 0));
      w.sample_digest = c.string((*ws)[i], path, "sample_sha256", true);
      p.weights.push_back(std::move(w));
    }
  if (const json* m = c.get(p.doc, "", "memory", Kind::Object, false))
    c.kinds(*m, "memory",
            {{"arena_bytes", Kind::Integer},
             {"peak_live_bytes", Kind::Integer},
             {"unpacked_bytes", Kind::Integer},
             {"buffers", Kind::Integer}});
  p.graph = c.relative_path(p.doc, "", "graph", false, "graph.ir");
  c.kinds(p.doc, "", {{"passes", Kind::Array}});
  read_pipeline(c, p);
  read_codegen(c, p);
  read_digests(c, p);
  return p;
}

} // namespace xserv::cli
