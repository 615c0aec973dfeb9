// read_plan / plan_from_json: plan.json into runtime::Plan, each field's type and range checked
// once, here, so that nothing that runs, inspects or replays a plan meets a raw JSON type error.
#include <cctype>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "base/error.h"
#include "runtime/layout_json.h"
#include "runtime/plan_io.h"
#include "runtime/plan_json.h"

namespace xserv::runtime {
namespace fs = std::filesystem;
using json = nlohmann::json;

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

/// 64 lowercase hex digits.
bool is_sha256_hex(const json& v) {
  return v.is_string() && v.get<std::string>().size() == 64 &&
         v.get<std::string>().find_first_not_of("0123456789abcdef") == std::string::npos;
}

std::string join(const std::string& path, const char* key) {
  return path.empty() ? key : path + "." + key;
}

/// Field access that names the file and the dotted field path in every error.
class Checker {
public:
  explicit Checker(fs::path file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw Error(fmt::format("{}: field '{}': {}", file_.string(), field, what));
  }

  /// obj[key] checked to be of `kind`; nullptr when absent and not required.
  const json* get(const json& obj, const std::string& path, const char* key, Kind kind,
                  bool required) const {
    auto it = obj.find(key);
    if (it == obj.end()) {
      if (required)
        fail(join(path, key), "missing");
      return nullptr;
    }
    if (!is_kind(*it, kind))
      fail(join(path, key), fmt::format("expected {}, found {}", kind_name(kind), shown(*it)));
    return &*it;
  }

  const json& need(const json& obj, const std::string& path, const char* key, Kind kind) const {
    return *get(obj, path, key, kind, true);
  }

  int64_t integer(const json& obj, const std::string& path, const char* key, int64_t lo,
                  int64_t hi) const {
    const json& v = need(obj, path, key, Kind::Integer);
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
      fail(join(path, key), fmt::format("must be in [{}, {}], found {}", lo, hi, shown(v)));
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi)
      fail(join(path, key), fmt::format("must be in [{}, {}], found {}", lo, hi, x));
    return x;
  }

  int small(const json& obj, const std::string& path, const char* key) const {
    return static_cast<int>(integer(obj, path, key, 0, INT32_MAX));
  }

  int64_t bytes(const json& obj, const std::string& path, const char* key) const {
    return integer(obj, path, key, 0, INT64_MAX);
  }

  double number(const json& obj, const std::string& path, const char* key) const {
    return need(obj, path, key, Kind::Number).get<double>();
  }

  bool boolean(const json& obj, const std::string& path, const char* key) const {
    return need(obj, path, key, Kind::Bool).get<bool>();
  }

  std::string string(const json& obj, const std::string& path, const char* key) const {
    return need(obj, path, key, Kind::String).get<std::string>();
  }

  /// One of `names`, as its index.
  size_t choice(const json& obj, const std::string& path, const char* key,
                std::initializer_list<const char*> names) const {
    const std::string v = string(obj, path, key);
    size_t i = 0;
    std::string list;
    for (const char* n : names) {
      if (v == n)
        return i;
      list += fmt::format("{}\"{}\"", i ? (i + 1 == names.size() ? " or " : ", ") : "", n);
      ++i;
    }
    fail(join(path, key), fmt::format("must be {}, found \"{}\"", list, v));
  }

  /// A path inside the directory it is joined to (`where`: "plan" or "checkpoint").
  std::string relative_path(const json& obj, const std::string& path, const char* key,
                            const char* where) const {
    std::string p = string(obj, path, key);
    if (!confined_path(p))
      fail(join(path, key), fmt::format("\"{}\" is not a path inside the {} directory", p, where));
    return p;
  }

  /// Element i of a list, checked to be an object.
  const json& object_at(const json& list, const std::string& path, size_t i) const {
    if (!list[i].is_object())
      fail(fmt::format("{}[{}]", path, i),
           fmt::format("expected an object, found {}", shown(list[i])));
    return list[i];
  }

  /// A reader of a nested part (layout, launch table) whose own errors get this field's name.
  template <typename F> auto nested(const std::string& field, F&& read) const {
    try {
      return read();
    } catch (const Error& e) {
      fail(field, e.what());
    }
  }

private:
  fs::path file_;
};

PlanOptions read_options(const Checker& c, const json& doc) {
  const json& o = c.need(doc, "", "options", Kind::Object);
  PlanOptions p;
  p.max_batch = c.integer(o, "options", "max_batch", 1, kPlanMaxBatch);
  p.max_seq = c.integer(o, "options", "max_seq", 1, kPlanMaxSeq);
  p.pp = static_cast<int>(c.integer(o, "options", "pp", 1, kPlanMaxStages));
  p.prefill_chunk = c.integer(o, "options", "prefill_chunk", 1, kPlanMaxSeq);
  p.last_logits_only = c.boolean(o, "options", "last_logits_only");
  p.kv_dtype = c.choice(o, "options", "kv_dtype", {"f32", "bf16"}) ? KvDtype::Bf16 : KvDtype::F32;
  p.kv_block = c.integer(o, "options", "kv_block", 1, 1024);
  if ((p.kv_block & (p.kv_block - 1)) != 0)
    c.fail("options.kv_block", fmt::format("{} is not a power of two", p.kv_block));
  p.gemm_split = c.choice(o, "options", "gemm_precision", {"split", "bf16"}) == 0;
  p.arch = c.string(o, "options", "arch");
  const bool arch_ok =
      p.arch.size() > 3 && p.arch.rfind("sm_", 0) == 0 &&
      std::isdigit(static_cast<unsigned char>(p.arch[3])) &&
      p.arch.find_first_not_of("0123456789abcdefghijklmnopqrstuvwxyz_") == std::string::npos;
  if (!arch_ok)
    c.fail("options.arch",
           fmt::format("expected a GPU architecture like \"sm_90\", found \"{}\"", p.arch));
  const ExpertFormat formats[] = {ExpertFormat::Bf16, ExpertFormat::Mxfp4, ExpertFormat::Both};
  p.expert_format = formats[c.choice(o, "options", "expert_format", {"bf16", "mxfp4", "both"})];
  if (o.contains("dense_gemm"))
    p.dense_cublas = c.choice(o, "options", "dense_gemm", {"wg", "cublas"}) == 1;
  if (o.contains("gemm_order")) {
    const int order = c.choice(o, "options", "gemm_order", {"fast", "canonical", "natural"});
    p.gemm_canonical = order >= 1;
    p.gemm_natural = order == 2;
  }
  if (o.contains("timeline"))
    p.timeline = c.boolean(o, "options", "timeline");
  if (o.contains("mxfp4_max_scale"))
    p.mxfp4_max_scale = static_cast<int>(c.integer(o, "options", "mxfp4_max_scale", 0, 128));
  return p;
}

PlanCodegen read_codegen(const Checker& c, const json& cg, const PlanOptions& opts) {
  PlanCodegen out;
  out.arch = c.string(cg, "codegen", "arch");
  if (out.arch != opts.arch)
    c.fail("codegen.arch", fmt::format("\"{}\", but options.arch is \"{}\"", out.arch, opts.arch));
  out.launches_per_decode_step = c.small(cg, "codegen", "launches_per_decode_step");
  out.prefill_step_tokens = c.small(cg, "codegen", "prefill_step_tokens");
  out.launches_per_prefill_step = c.small(cg, "codegen", "launches_per_prefill_step");
  const json& ks = c.need(cg, "codegen", "kernels", Kind::Array);
  std::set<std::string> names;
  for (size_t i = 0; i < ks.size(); ++i) {
    const std::string path = fmt::format("codegen.kernels[{}]", i);
    const json& k = c.object_at(ks, "codegen.kernels", i);
    PlanKernelFile f;
    f.name = c.string(k, path, "name");
    // Kernel names become file names (kernels/NAME.cubin): identifiers only, never a path.
    if (f.name.empty() || f.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRS"
                                                   "TUVWXYZ0123456789_") != std::string::npos)
      c.fail(path + ".name",
             fmt::format("\"{}\" is not a kernel name (letters, digits and _)", f.name));
    if (!names.insert(f.name).second)
      c.fail(path + ".name", fmt::format("\"{}\" is listed twice", f.name));
    if (c.string(k, path, "source") != f.source_path())
      c.fail(path + ".source", fmt::format("expected \"{}\"", f.source_path()));
    if (const json* cubin = c.get(k, path, "cubin", Kind::String, false)) {
      if (cubin->get<std::string>() != f.cubin_path())
        c.fail(path + ".cubin", fmt::format("expected \"{}\"", f.cubin_path()));
      f.cubin = true;
    }
    f.block = static_cast<int>(c.integer(k, path, "block", 1, 1024));
    f.nodes = c.small(k, path, "nodes");
    f.decode_launches = c.small(k, path, "decode_launches");
    f.prefill_launches = c.small(k, path, "prefill_launches");
    out.kernels.push_back(std::move(f));
  }
  return out;
}

/// The stage's layout and launch table from `obj` (codegen, or a pipeline stage), checked
/// against the options and the plan's kernels.
void read_stage_code(const Checker& c, const json& obj, const std::string& path,
                     const PlanOptions& opts, const PlanCodegen& cg, PlanStage& s) {
  const std::string lf = join(path, "layout"), tf = join(path, "launch_table");
  const json& lj = c.need(obj, path, "layout", Kind::Object);
  s.layout = c.nested(lf, [&] { return stage_layout_from_json(lj); });
  const json& tj = c.need(obj, path, "launch_table", Kind::Object);
  s.table = c.nested(tf, [&] { return launch_table_from_json(tj); });
  const StageLayout& l = s.layout;
  if (l.max_batch != opts.max_batch || l.max_seq != opts.max_seq)
    c.fail(lf, fmt::format("is for max batch {} and max sequence {}, options say {} and {}",
                           l.max_batch, l.max_seq, opts.max_batch, opts.max_seq));
  if (l.gemm_split != opts.gemm_split)
    c.fail(lf + ".gemm_split", "disagrees with options.gemm_precision");
  if (l.kv_block != opts.kv_block)
    c.fail(lf + ".kv_block",
           fmt::format("{}, but options.kv_block is {}", l.kv_block, opts.kv_block));
  if (l.mxfp4_max_scale != opts.mxfp4_max_scale)
    c.fail(lf + ".mxfp4_max_scale", fmt::format("{}, but options.mxfp4_max_scale is {}",
                                                l.mxfp4_max_scale, opts.mxfp4_max_scale));
  if (l.expert_format != opts.expert_format)
    c.fail(lf + ".expert_format", fmt::format("\"{}\", but options.expert_format is \"{}\"",
                                              expert_format_name(l.expert_format),
                                              expert_format_name(opts.expert_format)));
  std::set<std::string> known;
  for (const PlanKernelFile& k : cg.kernels)
    known.insert(k.name);
  for (size_t i = 0; i < s.table.kernels.size(); ++i)
    if (!known.count(s.table.kernels[i].name))
      c.fail(fmt::format("{}.kernels[{}]", tf, i),
             fmt::format("\"{}\" is not among codegen.kernels", s.table.kernels[i].name));
}

std::vector<PlanTransfer> read_transfers(const Checker& c, const json& st, const std::string& path,
                                         const char* key, int pp) {
  const json& list = c.need(st, path, key, Kind::Array);
  const std::string field = join(path, key);
  std::vector<PlanTransfer> out;
  for (size_t i = 0; i < list.size(); ++i) {
    const json& t = c.object_at(list, field, i);
    const std::string at = fmt::format("{}[{}]", field, i);
    PlanTransfer x;
    x.name = c.string(t, at, "name");
    if (x.name.empty())
      c.fail(at + ".name", "empty");
    x.peer = static_cast<int>(c.integer(t, at, "peer", 0, pp - 1));
    out.push_back(std::move(x));
  }
  return out;
}

PlanStage read_pipeline_stage(const Checker& c, const json& st, size_t i, const PlanOptions& opts,
                              const PlanCodegen& cg) {
  const std::string path = fmt::format("pipeline.stages[{}]", i);
  PlanStage s;
  c.integer(st, path, "stage", int64_t(i), int64_t(i));
  s.graph = c.relative_path(st, path, "graph", "plan");
  // Each stage runs its own program: a path to another stage's file (digest intact) would run
  // the wrong layers.
  if (s.graph != fmt::format("stage{}.ir", i))
    c.fail(path + ".graph",
           fmt::format("stage {}'s program is stage{}.ir, found \"{}\"", i, i, s.graph));
  const json& l = c.need(st, path, "layers", Kind::Array);
  if (l.size() != 2 || !l[0].is_number_integer() || !l[1].is_number_integer() ||
      l[0].get<int64_t>() < -1 || l[1].get<int64_t>() < l[0].get<int64_t>() ||
      l[1].get<int64_t>() > 4096)
    c.fail(path + ".layers", fmt::format("expected [FIRST, LAST], found {}", shown(l)));
  s.first_layer = l[0].get<int>();
  s.last_layer = l[1].get<int>();
  s.embedding = c.boolean(st, path, "embedding");
  s.head = c.boolean(st, path, "head");
  s.sends = read_transfers(c, st, path, "sends", opts.pp);
  s.recvs = read_transfers(c, st, path, "recvs", opts.pp);
  s.weight_bytes = c.bytes(st, path, "weight_bytes");
  s.kv_cache_bytes = c.bytes(st, path, "kv_cache_bytes");
  s.decode_bytes_per_token = c.bytes(st, path, "decode_bytes_per_token");
  s.prefill_flops_per_token = c.number(st, path, "prefill_flops_per_token");
  s.estimated_decode_ms = c.number(st, path, "estimated_decode_ms");
  s.estimated_prefill_us_per_token = c.number(st, path, "estimated_prefill_us_per_token");
  s.activation_arena_bytes = c.bytes(st, path, "activation_arena_bytes");
  s.launches_per_decode_step = c.small(st, path, "launches_per_decode_step");
  read_stage_code(c, st, path, opts, cg, s);
  return s;
}

/// The whole graph as the one stage of a pp 1 plan: its code in "codegen".
PlanStage read_whole_stage(const Checker& c, const json& cg, const Plan& p) {
  PlanStage s;
  s.graph = p.graph;
  s.first_layer = 0;
  s.last_layer = static_cast<int>(c.integer(p.config, "config", "num_hidden_layers", 1, 4096)) - 1;
  s.launches_per_decode_step = p.codegen.launches_per_decode_step;
  s.activation_arena_bytes = p.memory.arena_bytes;
  read_stage_code(c, cg, "codegen", p.options, p.codegen, s);
  // The arena fields beside the layout repeat it for readers of the file: they must agree.
  if (c.integer(cg, "codegen", "arena_tokens", 1, kPlanMaxSeq) != s.layout.tokens)
    c.fail("codegen.arena_tokens", "disagrees with codegen.layout.tokens");
  if ((c.choice(cg, "codegen", "gemm_precision", {"split", "bf16"}) == 0) != s.layout.gemm_split)
    c.fail("codegen.gemm_precision", "disagrees with codegen.layout.gemm_split");
  if (uint64_t(c.bytes(cg, "codegen", "arena_bytes")) != s.layout.arena_bytes)
    c.fail("codegen.arena_bytes", "disagrees with codegen.layout.arena_bytes");
  return s;
}

void read_stages(const Checker& c, const json& doc, Plan& p) {
  const json& cg = c.need(doc, "", "codegen", Kind::Object);
  p.codegen = read_codegen(c, cg, p.options);
  const json* pl = c.get(doc, "", "pipeline", Kind::Object, false);
  if (!pl) {
    if (p.options.pp != 1)
      c.fail("pipeline", fmt::format("missing, but options.pp is {}", p.options.pp));
    p.stages.push_back(read_whole_stage(c, cg, p));
    return;
  }
  const json& stages = c.need(*pl, "pipeline", "stages", Kind::Array);
  if (static_cast<int64_t>(stages.size()) != p.options.pp || stages.size() < 2)
    c.fail("pipeline.stages", fmt::format("has {} stages, but options.pp is {} (at least 2)",
                                          stages.size(), p.options.pp));
  p.imbalance = c.number(*pl, "pipeline", "imbalance");
  for (size_t i = 0; i < stages.size(); ++i)
    p.stages.push_back(
        read_pipeline_stage(c, c.object_at(stages, "pipeline.stages", i), i, p.options, p.codegen));
}

void read_digests(const Checker& c, const json& doc, Plan& p) {
  const json& d = c.need(doc, "", "digests", Kind::Object);
  for (auto it = d.begin(); it != d.end(); ++it) {
    const std::string field = "digests." + it.key();
    if (!confined_path(it.key()))
      c.fail(field, "is not a path inside the plan directory");
    if (!is_sha256_hex(*it))
      c.fail(field, fmt::format("expected a SHA-256 in hex, found {}", shown(*it)));
    p.digests[it.key()] = it->get<std::string>();
  }
  std::vector<std::string> programs{p.graph};
  for (const PlanStage& s : p.stages)
    programs.push_back(s.graph);
  for (const std::string& f : programs)
    if (!p.digests.count(f))
      c.fail("digests", fmt::format("has no entry for {}", f));
}

} // namespace

Plan plan_from_json(const json& doc, const fs::path& file) {
  if (!doc.is_object())
    throw Error(fmt::format("{}: not an xserv plan (expected a JSON object)", file.string()));
  const Checker c(file);
  Plan p;
  if (const std::string f = c.string(doc, "", "format"); f != "xserv-plan")
    c.fail("format", fmt::format("expected \"xserv-plan\", found \"{}\"", f));
  const json& version = c.need(doc, "", "version", Kind::Integer);
  if (!version.is_number_integer() || version.get<int64_t>() != kPlanVersion)
    c.fail("version", fmt::format("{}, but this xserv reads version {}: recompile the plan",
                                  shown(version), kPlanVersion));
  p.model_dir = c.string(doc, "", "model_dir");
  if (p.model_dir.empty())
    c.fail("model_dir", "empty (the checkpoint directory the plan was compiled from)");
  p.model_digest = c.string(doc, "", "model_digest");
  if (p.model_digest.empty())
    c.fail("model_digest", "empty (it ties the plan to its checkpoint's config.json)");
  p.config = c.need(doc, "", "config", Kind::Object);
  if (c.get(doc, "", "tokenizer", Kind::String, false))
    p.tokenizer = c.relative_path(doc, "", "tokenizer", "checkpoint");
  p.options = read_options(c, doc);
  const json& ws = c.need(doc, "", "weights", Kind::Array);
  for (size_t i = 0; i < ws.size(); ++i) {
    const std::string path = fmt::format("weights[{}]", i);
    const json& w = c.object_at(ws, "weights", i);
    PlanWeightFile f;
    f.file = c.relative_path(w, path, "file", "checkpoint");
    f.bytes = static_cast<uint64_t>(c.bytes(w, path, "bytes"));
    f.sample_sha256 = c.string(w, path, "sample_sha256");
    if (const json* full = c.get(w, path, "sha256", Kind::String, false)) {
      if (!is_sha256_hex(*full))
        c.fail(path + ".sha256", fmt::format("expected a SHA-256 in hex, found {}", shown(*full)));
      f.sha256 = full->get<std::string>();
    }
    p.weights.push_back(std::move(f));
  }
  const json& m = c.need(doc, "", "memory", Kind::Object);
  p.memory.arena_bytes = c.bytes(m, "memory", "arena_bytes");
  p.memory.peak_live_bytes = c.bytes(m, "memory", "peak_live_bytes");
  p.memory.unpacked_bytes = c.bytes(m, "memory", "unpacked_bytes");
  p.memory.buffers = c.bytes(m, "memory", "buffers");
  p.graph = c.relative_path(doc, "", "graph", "plan");
  const json& passes = c.need(doc, "", "passes", Kind::Array);
  for (size_t i = 0; i < passes.size(); ++i) {
    const std::string path = fmt::format("passes[{}]", i);
    const json& pass = c.object_at(passes, "passes", i);
    p.passes.push_back({c.string(pass, path, "name"), c.number(pass, path, "ms"),
                        c.boolean(pass, path, "changed")});
  }
  read_stages(c, doc, p);
  read_digests(c, doc, p);
  return p;
}

Plan read_plan(const fs::path& dir) {
  const fs::path file = dir / "plan.json";
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw Error(fmt::format("{}: cannot read", file.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  const json doc = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded())
    throw Error(fmt::format("{}: not valid JSON", file.string()));
  return plan_from_json(doc, file);
}

} // namespace xserv::runtime
