// The launch table reproduces the launches of the closures it replaced: every launch (kernel,
// grid, block, shared memory, argument bytes with device pointers decoded back to symbolic
// regions) of many step shapes, compared with golden records made from the closure lowering.
//
// Regenerate after an intended change to the launches (same commit, with a reason):
//   XSERV_UPDATE_GOLDEN=1 build/tests/codegen_tests -tc="*launch*golden*"
#include "codegen/emit_wg.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "codegen/cuda_lower.h"
#include "compiler/memory_plan.h"
#include "compiler/pass_manager.h"
#include "models/config.h"
#include "models/gpt_oss.h"
#include "models/step.h"
#include "runtime/executor.h"
#include "runtime/plan_json.h"
#include "runtime/sha256.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace xserv;

namespace {

/// Fake device memory: each region (the arena, a param, a weight, a cache, a scratch buffer)
/// gets its own base address 64 GiB apart, so a pointer argument decodes to (region, offset).
class FakeMemory {
public:
  void* at(const std::string& region, uint64_t offset = 0) {
    auto [it, fresh] = base_.try_emplace(region, next_);
    if (fresh)
      next_ += kSpan;
    return reinterpret_cast<void*>(it->second + offset);
  }
  std::string decode(uint64_t p) const {
    if (p == 0)
      return "null";
    for (const auto& [region, b] : base_)
      if (p >= b && p < b + kSpan)
        return fmt::format("{}+{}", short_name(region), p - b);
    return fmt::format("0x{:x}", p);
  }

private:
  /// Weight names without their common parts, to keep the golden files small.
  static std::string short_name(std::string r) {
    for (const char* part : {"model.", "self_attn.", "mlp.", "experts."})
      for (size_t at; (at = r.find(part)) != std::string::npos;)
        r.erase(at, std::strlen(part));
    return r;
  }

  static constexpr uint64_t kSpan = uint64_t{1} << 36;
  std::map<std::string, uint64_t> base_;
  uint64_t next_ = uint64_t{1} << 44;
};

/// One launch as one line: kernel name, grid, block, smem, then each argument (pointers as
/// region+offset, 4-byte values as ints).
std::string launch_line(const runtime::LaunchRecord& r, const std::string& kernel,
                        const FakeMemory& mem) {
  std::string s = fmt::format("{} g={},{},{} b={} s={}", kernel, r.grid[0], r.grid[1], r.grid[2],
                              r.block, r.smem);
  for (const std::string& a : r.args) {
    if (a.size() == 8) {
      uint64_t p = 0;
      std::memcpy(&p, a.data(), 8);
      s += ' ';
      s += mem.decode(p);
    } else if (a.size() == 4) {
      int32_t i = 0;
      std::memcpy(&i, a.data(), 4);
      s += fmt::format(" i{}", i);
    } else {
      s += " x";
      for (unsigned char c : a)
        s += fmt::format("{:02x}", c);
    }
  }
  return s;
}

/// The prefill chunk the golden records were made with (the engine's default then); a
/// change-detector of the lowering for fixed capacities, whatever today's default is.
constexpr int kGoldenChunk = 1024;

/// How the lowering is set up: the engine's options that change launches.
struct Variant {
  std::string name;
  bool gemm_split = true;
  int prefill_chunk = kGoldenChunk;
  bool kv_bf16 = false;
  bool decode = true, prefill = true; ///< which shapes it records
};

const std::vector<Variant>& variants() {
  static const std::vector<Variant> v = {
      {"split", true, kGoldenChunk, false, true, true},
      {"bf16", false, kGoldenChunk, false, false, true},
      {"chunk8", true, 8, false, true, false},
      {"kvbf16", true, kGoldenChunk, true, true, true},
  };
  return v;
}

struct Shape {
  int tokens, seqs, max_pos;
  std::string name() const { return fmt::format("T={} B={} pos={}", tokens, seqs, max_pos); }
};

/// The step shapes a variant records: decode (tokens = seqs) at positions that cross the
/// attention key buckets, prefill-like steps around the decode/gemm/split-K/tiling thresholds.
std::vector<Shape> shapes(const Variant& v, int capacity) {
  std::vector<Shape> out;
  if (v.decode)
    for (int b : {1, 2, 3, 8})
      for (int pos : {0, 63, 64, 200, 3000, 5000})
        out.push_back({b, b, pos});
  if (v.decode && capacity == 8)
    for (Shape s : {Shape{5, 1, 4}, Shape{8, 3, 100}})
      out.push_back(s);
  if (v.prefill)
    for (int t : {9, 17, 33, 64, 65, 100, 512, 1024})
      for (int b : {1, 3})
        for (int pos : {t - 1, 4000})
          if (t <= capacity)
            out.push_back({t, b, pos});
  return out;
}

constexpr int64_t kMaxBatch = 8, kMaxSeq = 8192;

/// The launches of every shape of one variant, and the scratch buffers the lowering asked for.
struct Recorded {
  std::vector<std::string> scratch; ///< "bytes" or "bytes:sha256 of the constant"
  std::vector<std::pair<std::string, std::vector<std::string>>> shapes;
};

ir::Graph final_graph(const models::ModelConfig& cfg, const Variant& v) {
  models::BuildOptions bo;
  bo.kv_dtype = v.kv_bf16 ? ir::DType::BF16 : ir::DType::F32;
  compiler::PassManager pm;
  pm.add_passes(compiler::kDefaultPasses);
  return pm.run(models::build_gpt_oss(cfg, bo));
}

/// The graph lowered for a variant, as the CUDA engine lowers it.
struct Lowered {
  ir::Graph graph;
  compiler::MemoryPlan memory;
  codegen::KernelSet kernels;
  runtime::LaunchTable table;
  int capacity = 0;
};

void lower(const models::ModelConfig& cfg, const Variant& v, Lowered& out,
           int64_t max_batch = kMaxBatch) {
  out.graph = final_graph(cfg, v);
  out.capacity = codegen::step_token_capacity(max_batch, v.prefill_chunk);
  out.memory = compiler::plan_memory(out.graph, {{ir::dims::kTokens, out.capacity},
                                                 {ir::dims::kSeqs, max_batch},
                                                 {ir::dims::kTableBlocks, (kMaxSeq + 15) / 16}});
  codegen::LoweringContext ctx;
  ctx.max_tokens = out.capacity;
  ctx.max_seqs = int(max_batch);
  ctx.max_seq = kMaxSeq;
  ctx.gemm_split = v.gemm_split;
  ctx.memory = &out.memory;
  out.table = codegen::lower_graph(out.graph, out.kernels, ctx);
}

/// Records with the launch table's executor, bound to fake memory. The golden records came
/// from the closure lowering the table replaced, its addresses from the same regions: params,
/// weights and caches by name and index, activations at their arena offsets, scratch buffers
/// in allocation order.
/// Fake-memory bindings of a lowered table's regions (and its scratch list into `out`).
runtime::Bindings bind(const Lowered& lw, FakeMemory& mem, Recorded& out) {
  const runtime::LaunchTable& t = lw.table;
  runtime::Bindings b;
  b.arena = mem.at("arena");
  int caches = 0;
  for (ir::ValueId i = 0; i < static_cast<ir::ValueId>(lw.graph.size()); ++i) {
    const ir::Node& n = lw.graph.node(i);
    if (n.op == ir::Op::Param)
      b.params[n.attr_str("name")] = mem.at("param:" + n.attr_str("name"));
    if (n.op == ir::Op::Weight)
      b.weights[n.attr_str("name")] = mem.at("w:" + n.attr_str("name"));
    if (n.op == ir::Op::Cache)
      b.caches.push_back(mem.at(fmt::format("cache:{}", caches++)));
  }
  for (size_t i = 0; i < t.scratch.size(); ++i) {
    std::string d = std::to_string(t.scratch[i].bytes);
    if (!t.scratch[i].f64.empty()) {
      d += ':';
      d += runtime::sha256_hex({reinterpret_cast<const char*>(t.scratch[i].f64.data()),
                                t.scratch[i].f64.size() * sizeof(double)});
    }
    out.scratch.push_back(d);
    b.scratch.push_back(mem.at(fmt::format("scratch:{}", i)));
  }
  if (t.argmax_scratch >= 0)
    out.scratch.push_back(
        fmt::format("argmax_keys={} chunks={}",
                    mem.decode(reinterpret_cast<uint64_t>(b.scratch[size_t(t.argmax_scratch)])),
                    t.argmax_chunks));
  if (!t.masked_pick.empty())
    out.scratch.push_back(
        fmt::format("masks={} rows={} words={}",
                    mem.decode(reinterpret_cast<uint64_t>(b.scratch[size_t(t.mask_scratch)])),
                    mem.decode(reinterpret_cast<uint64_t>(b.scratch[size_t(t.mask_rows_scratch)])),
                    t.mask_words));
  return b;
}

Recorded record(const models::ModelConfig& cfg, const Variant& v) {
  Lowered lw;
  lower(cfg, v, lw);
  const runtime::LaunchTable& t = lw.table;
  FakeMemory mem;
  Recorded out;
  const runtime::Executor ex(t, bind(lw, mem, out));
  for (const Shape& s : shapes(v, lw.capacity)) {
    std::vector<std::string> lines;
    for (const runtime::LaunchRecord& r : ex.record({s.tokens, s.seqs, s.max_pos})) {
      const std::string name =
          r.kernel >= 0 ? t.kernels.at(size_t(r.kernel)).name
                        : fmt::format("library_gemm_n{}_k{}", t.library.at(size_t(r.library)).n,
                                      t.library.at(size_t(r.library)).k);
      lines.push_back(launch_line(r, name, mem));
    }
    out.shapes.emplace_back(s.name(), std::move(lines));
  }
  if (ex.picks_masked()) { // structured output's masked pick, outside every step
    std::vector<std::string> lines;
    for (const runtime::LaunchRecord& r : ex.record_masked(3))
      lines.push_back(launch_line(r, t.kernels.at(size_t(r.kernel)).name, mem));
    out.shapes.emplace_back("masked_pick_rows3", std::move(lines));
  }
  return out;
}

bool update_golden() {
  const char* u = std::getenv("XSERV_UPDATE_GOLDEN");
  return u && std::string(u) == "1";
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Launch count and sha256 of the lines per shape of a variant, and of its scratch list.
nlohmann::json digests(const Recorded& r) {
  nlohmann::json shapes_json = nlohmann::json::object();
  for (const auto& [name, ls] : r.shapes) {
    runtime::Sha256 h;
    for (const std::string& l : ls)
      h.update_field(l);
    shapes_json[name] = {{"launches", ls.size()}, {"sha256", h.hex_digest()}};
  }
  runtime::Sha256 hs;
  for (const std::string& s : r.scratch)
    hs.update_field(s);
  return {{"scratch_sha256", hs.hex_digest()}, {"shapes", shapes_json}};
}

/// A small config's golden: the "split" variant in full (distinct launch lines once, each shape
/// as indices into them), the other variants as digests.
nlohmann::json full_golden(const models::ModelConfig& cfg) {
  nlohmann::json lines = nlohmann::json::array(), vars = nlohmann::json::object();
  std::map<std::string, int> index;
  for (const Variant& v : variants()) {
    const Recorded r = record(cfg, v);
    if (v.name != "split") {
      vars[v.name] = digests(r);
      continue;
    }
    nlohmann::json shapes_json = nlohmann::json::object();
    for (const auto& [name, ls] : r.shapes) {
      std::vector<int> ids;
      for (const std::string& l : ls) {
        auto [it, fresh] = index.try_emplace(l, int(index.size()));
        if (fresh)
          lines.push_back(l);
        ids.push_back(it->second);
      }
      shapes_json[name] = ids;
    }
    vars[v.name] = {{"scratch", r.scratch}, {"shapes", shapes_json}};
  }
  return {{"lines", lines}, {"variants", vars}};
}

/// A large config's golden: digests of every variant.
nlohmann::json digest_golden(const models::ModelConfig& cfg) {
  nlohmann::json vars = nlohmann::json::object();
  for (const Variant& v : variants())
    vars[v.name] = digests(record(cfg, v));
  return vars;
}

/// JSON laid out for diffs: objects and string arrays one entry per line, arrays of numbers and
/// objects of scalars on one line, so a changed launch shows as a changed line.
std::string golden_text(const nlohmann::json& j, const std::string& indent = "") {
  const auto scalar = [](const nlohmann::json& e) { return !e.is_structured(); };
  const bool compact = j.is_primitive() || (j.is_array() && j.size() > 0 && j[0].is_number()) ||
                       (j.is_object() && std::all_of(j.begin(), j.end(), scalar));
  if (compact || j.empty())
    return j.dump();
  const std::string in = indent + " ";
  std::string s = j.is_object() ? "{" : "[";
  bool first = true;
  for (const auto& [key, value] : j.items()) {
    s += (first ? "\n" : ",\n") + in;
    first = false;
    if (j.is_object())
      s += nlohmann::json(key).dump() + ": ";
    s += golden_text(value, in);
  }
  return s + "\n" + indent + (j.is_object() ? "}" : "]");
}

/// Compares `got` with the golden file (or writes it under XSERV_UPDATE_GOLDEN=1), naming the
/// first differing entry.
void check_golden(const nlohmann::json& got, const fs::path& file) {
  if (update_golden())
    std::ofstream(file, std::ios::binary) << golden_text(got) << "\n";
  REQUIRE_MESSAGE(fs::exists(file), file.string() << " is missing");
  const nlohmann::json want = nlohmann::json::parse(read_text(file));
  if (got == want)
    return;
  const nlohmann::json diff = nlohmann::json::diff(want, got);
  FAIL_CHECK("launches differ from " << file.string() << ": " << diff.dump().substr(0, 2000));
}

} // namespace

TEST_CASE("launches of the small configs match their golden records") {
  // tiny and window16 (sliding-window caches) in full; tiny2l and deep4l as digests.
  const fs::path src = testing::source_dir();
  const std::vector<std::tuple<std::string, fs::path, bool>> configs = {
      {"tiny", src / "examples/tiny/config.json", true},
      {"window16", src / "tests/fixtures/window16/config.json", true},
      {"tiny2l", src / "tests/fixtures/tiny2l/config.json", false},
      {"deep4l", src / "tests/fixtures/deep4l/config.json", false},
  };
  for (const auto& [name, file, full] : configs) {
    CAPTURE(name);
    const models::ModelConfig cfg = models::ModelConfig::load(file);
    check_golden(full ? full_golden(cfg) : digest_golden(cfg),
                 src / "tests/fixtures/launches" / (name + ".json"));
  }
}

TEST_CASE("launches of the 20b and 120b configs match their golden digests") {
  const fs::path src = testing::source_dir();
  nlohmann::json got = nlohmann::json::object();
  got["gpt-oss-120b"] =
      digest_golden(models::ModelConfig::load(src / "examples/gpt-oss-120b/config.json"));
  if (auto data = testing::data_dir(); data && fs::exists(*data / "gpt-oss-20b/config.json"))
    got["gpt-oss-20b"] =
        digest_golden(models::ModelConfig::load(*data / "gpt-oss-20b/config.json"));
  else
    MESSAGE("gpt-oss-20b: shared data directory not found, only 120b checked");
  const fs::path file = src / "tests/fixtures/launches/large_digests.json";
  if (!got.contains("gpt-oss-20b") && !update_golden()) {
    const nlohmann::json want = nlohmann::json::parse(read_text(file));
    CHECK(got["gpt-oss-120b"] == want.at("gpt-oss-120b"));
    return;
  }
  check_golden(got, file);
}

TEST_CASE("decode steps of more than 64 sequences keep the decode attention kernel") {
  // One token a sequence: attention_decode in one key split, no combine; a step with a prompt
  // of the same size takes the prompt kernel's query tiles.
  const models::ModelConfig cfg =
      models::ModelConfig::load(testing::source_dir() / "examples/tiny/config.json");
  for (bool split : {false, true}) {
    CAPTURE(split);
    const Variant v{"many", split, kGoldenChunk, false, true, true};
    Lowered lw;
    lower(cfg, v, lw, 640);
    FakeMemory mem;
    Recorded scratch;
    const runtime::Executor ex(lw.table, bind(lw, mem, scratch));
    auto count = [&](const runtime::StepShape& s, const std::string& prefix) {
      int n = 0;
      for (const runtime::LaunchRecord& r : ex.record(s))
        n += r.kernel >= 0 && lw.table.kernels.at(size_t(r.kernel)).name.starts_with(prefix);
      return n;
    };
    const int layers = int(cfg.num_hidden_layers);
    for (int seqs : {64, 65, 100, 600}) {
      CAPTURE(seqs);
      CHECK(count({seqs, seqs, 300}, "attention_decode") == layers);
      CHECK(count({seqs, seqs, 300}, "attention_prefill") == 0);
    }
    CHECK(count({100, 1, 300}, "attention_decode") == 0);
    CHECK(count({100, 1, 300}, "attention_prefill") == layers);
    CHECK(count({100, 40, 300}, "attention_prefill") == layers);
    CHECK(count({100, 100, 300}, "attention_combine") == 0);
  }
}

TEST_CASE("the launch table's JSON round trip is lossless and compact") {
  const fs::path src = testing::source_dir();
  for (const Variant& v : variants()) {
    CAPTURE(v.name);
    Lowered lw;
    lower(models::ModelConfig::load(src / "tests/fixtures/window16/config.json"), v, lw);
    const nlohmann::json j = runtime::launch_table_to_json(lw.table);
    const runtime::LaunchTable back =
        runtime::launch_table_from_json(nlohmann::json::parse(j.dump()));
    CHECK(back == lw.table);
    CHECK(runtime::launch_table_to_json(back) == j);
  }
  CHECK_THROWS_WITH_AS(runtime::launch_table_from_json(nlohmann::json::object()),
                       doctest::Contains("launch table in plan.json is malformed"), xserv::Error);
}

TEST_CASE("the executor refuses a table naming what is not bound") {
  const fs::path src = testing::source_dir();
  Lowered lw;
  lower(models::ModelConfig::load(src / "examples/tiny/config.json"), variants()[0], lw);
  const runtime::Bindings ok = runtime::placeholder_bindings(lw.table);
  CHECK_NOTHROW(runtime::Executor(lw.table, ok));

  runtime::Bindings no_weight = ok;
  no_weight.weights.erase("model.embed_tokens.weight");
  CHECK_THROWS_WITH_AS(runtime::Executor(lw.table, no_weight),
                       doctest::Contains("weight 'model.embed_tokens.weight'"), xserv::Error);

  runtime::LaunchTable bad_kernel = lw.table;
  bad_kernel.launches[3].kernel = int(bad_kernel.kernels.size());
  CHECK_THROWS_WITH_AS(
      runtime::Executor(bad_kernel, ok),
      doctest::Contains(
          fmt::format("uses kernel {}, but there are", bad_kernel.kernels.size()).c_str()),
      xserv::Error);

  runtime::Bindings no_cache = ok;
  no_cache.caches.pop_back();
  CHECK_THROWS_WITH_AS(runtime::Executor(lw.table, no_cache), doctest::Contains("cache"),
                       xserv::Error);

  runtime::Bindings no_param = ok;
  no_param.params.erase("positions");
  CHECK_THROWS_WITH_AS(runtime::Executor(lw.table, no_param),
                       doctest::Contains("step input 'positions'"), xserv::Error);

  // A split rule over a nonsensical head count (a hostile plan.json) is refused up front.
  runtime::LaunchTable bad_heads = lw.table;
  for (runtime::PlanLaunch& l : bad_heads.launches)
    if (l.splits_window >= 0)
      l.splits_heads = -3;
  CHECK_THROWS_WITH_AS(runtime::Executor(bad_heads, ok),
                       doctest::Contains("splits over -3 heads, outside 0..65536"), xserv::Error);
  // So is a key chunk the canonical kernels cannot take, or one on a launch with no splits.
  for (int chunk : {100, -64, 1 << 21}) {
    runtime::LaunchTable bad_chunk = lw.table;
    for (runtime::PlanLaunch& l : bad_chunk.launches)
      if (l.split_chunk > 0)
        l.split_chunk = chunk;
    const std::string want = "key chunks of " + std::to_string(chunk);
    CHECK_THROWS_WITH_AS(runtime::Executor(bad_chunk, ok), doctest::Contains(want.c_str()),
                         xserv::Error);
  }
  runtime::LaunchTable stray_chunk = lw.table;
  for (runtime::PlanLaunch& l : stray_chunk.launches)
    if (l.splits_window < 0)
      l.split_chunk = 128;
  CHECK_THROWS_WITH_AS(runtime::Executor(stray_chunk, ok), doctest::Contains("on a split launch"),
                       xserv::Error);

  // Loaded kernels must be the table's, one for one.
  CHECK_THROWS_WITH_AS(runtime::Executor(lw.table, ok, {runtime::LoadedKernel{}}),
                       doctest::Contains("were loaded"), xserv::Error);
  // Recording only: run() needs loaded kernels.
  CHECK_THROWS_WITH_AS(runtime::Executor(lw.table, ok).run({1, 1, 0}, nullptr),
                       doctest::Contains("only record"), xserv::Error);
}

namespace {

/// `g` lowered for steps of up to `tokens` tokens and kMaxBatch sequences on the warpgroup
/// gemms, its own memory plan, plain bf16 or split activations, cuBLAS projections or not.
runtime::LaunchTable lower_for(const ir::Graph& g, int64_t tokens, bool split, bool cublas,
                               runtime::ExpertFormat experts = runtime::ExpertFormat::Bf16,
                               bool canonical = false) {
  const compiler::MemoryPlan mem =
      compiler::plan_memory(g, {{ir::dims::kTokens, tokens},
                                {ir::dims::kSeqs, kMaxBatch},
                                {ir::dims::kTableBlocks, (kMaxSeq + 15) / 16}});
  codegen::LoweringContext ctx;
  ctx.max_tokens = static_cast<int>(tokens);
  ctx.max_seqs = int(kMaxBatch);
  ctx.max_seq = kMaxSeq;
  ctx.gemm_split = split;
  ctx.wgmma = true;
  ctx.dense_cublas = cublas;
  ctx.expert_format = experts;
  ctx.canonical = canonical;
  ctx.memory = &mem;
  codegen::KernelSet ks;
  return codegen::lower_graph(g, ks, ctx);
}

/// The kernels a step of `tokens` decode tokens (one a sequence) launches, in order.
std::vector<std::string> decode_kernel_names(const runtime::LaunchTable& t, int tokens) {
  std::vector<std::string> out;
  const runtime::Executor ex(t, runtime::placeholder_bindings(t));
  for (const runtime::LaunchRecord& r : ex.record({tokens, tokens, 100}))
    if (r.kernel >= 0)
      out.push_back(t.kernels.at(size_t(r.kernel)).name);
  return out;
}

} // namespace

TEST_CASE("the warpgroup gemms refuse a step past their 32-bit activation offsets") {
  // gemm_wg addresses an activation row as row x K in 32 bits: a plan whose steps reach 2^32
  // elements is refused at lowering, naming the flag that sets the step size.
  const models::ModelConfig cfg =
      models::ModelConfig::load(testing::source_dir() / "examples/tiny/config.json");
  const ir::Graph g = final_graph(cfg, variants()[1]);
  auto lower_tokens = [&](int64_t tokens) { return lower_for(g, tokens, false, false); };
  const int64_t limit = (int64_t{1} << 32) / cfg.hidden_size; // rows x hidden = 2^32
  CHECK_THROWS_WITH_AS(lower_tokens(limit),
                       doctest::Contains("past the gemms' 2^32 element offsets; compile with a "
                                         "smaller --prefill-chunk"),
                       xserv::Error);
  // The MoE down gemm's rows are (token, slot) pairs: k times the tokens.
  CHECK(cfg.num_experts_per_tok == 2);
  CHECK_THROWS_WITH_AS(lower_tokens(limit / 2), doctest::Contains("2^32 element offsets"),
                       xserv::Error);
  CHECK_NOTHROW(lower_tokens(1024));
}

TEST_CASE("--dense-gemm cublas: the projections of steps above 64 tokens are library calls") {
  const models::ModelConfig cfg =
      models::ModelConfig::load(testing::source_dir() / "examples/tiny/config.json");
  const ir::Graph g = final_graph(cfg, variants()[1]);
  const int capacity = codegen::step_token_capacity(kMaxBatch, kGoldenChunk);
  auto lower_with = [&](bool cublas, bool split) { return lower_for(g, capacity, split, cublas); };
  const runtime::LaunchTable wg = lower_with(false, false), lib = lower_with(true, false);
  CHECK(wg.library.empty());
  CHECK(lower_with(true, true).library.empty()); // split activations stay on gemm_wg
  // Per layer: q (64 -> 4 x 16), k and v (64 -> 2 x 16) and o_proj (64 -> 64); never the router
  // or lm_head.
  REQUIRE(lib.library.size() == size_t(4 * cfg.num_hidden_layers));
  for (size_t i = 0; i < lib.library.size(); ++i) {
    CAPTURE(i);
    CHECK(lib.library[i].k == 64);
    CHECK(lib.library[i].n == (i % 4 == 1 || i % 4 == 2 ? 32 : 64)); // q, k, v, o
    CHECK_FALSE(lib.library[i].accumulate);
  }
  // The same steps launch the same kernels up to 64 tokens; above, each library call replaces
  // a gemm_wg launch and brings its reduce (bias, residual).
  const runtime::Executor a(wg, runtime::placeholder_bindings(wg));
  const runtime::Executor b(lib, runtime::placeholder_bindings(lib));
  auto calls = [](const std::vector<runtime::LaunchRecord>& rs) {
    return std::count_if(rs.begin(), rs.end(), [](const auto& r) { return r.library >= 0; });
  };
  for (int tokens : {9, 64}) {
    CAPTURE(tokens);
    CHECK(a.record({tokens, 1, tokens - 1}).size() == b.record({tokens, 1, tokens - 1}).size());
    CHECK(calls(b.record({tokens, 1, tokens - 1})) == 0);
  }
  for (int tokens : {65, 200}) {
    CAPTURE(tokens);
    const std::vector<runtime::LaunchRecord> rs = b.record({tokens, 1, tokens - 1});
    CHECK(calls(rs) == 4 * cfg.num_hidden_layers);
    CHECK(rs.size() == a.record({tokens, 1, tokens - 1}).size() + size_t(calls(rs)));
    for (size_t i = 0; i < rs.size(); ++i) {
      if (rs[i].library < 0)
        continue;
      CHECK(rs[i].kernel == -1);
      CHECK(rs[i].grid[0] == unsigned(tokens)); // the call's rows
      CHECK(rs[i].args.size() == 3);
      REQUIRE(i + 1 < rs.size()); // its reduce follows
      CHECK(lib.kernels.at(size_t(rs[i + 1].kernel)).name.rfind("gemm_splitk_reduce", 0) == 0);
      // Its x was last written by gemm_act in K order (cuBLAS reads the checkpoint's rows; the
      // slot order of gemm_wg's activations would pair each weight with another K's value).
      std::string writer;
      for (size_t j = i; j-- > 0 && writer.empty();) {
        const std::string& name = lib.kernels.at(size_t(rs[j].kernel < 0 ? 0 : rs[j].kernel)).name;
        if (rs[j].kernel >= 0 && name.rfind("gemm_act", 0) == 0 &&
            rs[j].args.at(2) == rs[i].args[0])
          writer = name;
      }
      CHECK(writer.find("_natural") != std::string::npos);
    }
  }
  for (const runtime::LaunchRecord& r : b.record({64, 1, 63})) // gemm_wg's steps: slots
    if (r.kernel >= 0)
      CHECK(lib.kernels.at(size_t(r.kernel)).name.find("_natural") == std::string::npos);
  // Lossless through plan.json, and a launch naming no routine is refused.
  const nlohmann::json j = runtime::launch_table_to_json(lib);
  CHECK(runtime::launch_table_from_json(nlohmann::json::parse(j.dump())) == lib);
  runtime::LaunchTable bad = lib;
  for (runtime::PlanLaunch& l : bad.launches)
    if (l.library >= 0)
      l.args.pop_back();
  CHECK_THROWS_WITH_AS(runtime::Executor(bad, runtime::placeholder_bindings(bad)),
                       doctest::Contains("a call takes kernel -1, 3 arguments"), xserv::Error);
}

TEST_CASE("decode steps rotate and write the caches in qkv's epilogue up to 8 sequences") {
  // One token per sequence and at most 8 tokens: qkv_rope_decode does qkv, RoPE and both
  // cache writes (no rope launch); more sequences: the gemms, then rope_yarn_qk_kv; several
  // tokens of a sequence: qkv, rope_yarn_qk, and kv_write after attention.
  const models::ModelConfig cfg =
      models::ModelConfig::load(testing::source_dir() / "examples/tiny/config.json");
  const ir::Graph g = final_graph(cfg, variants()[1]);
  const runtime::LaunchTable t = lower_for(g, 64, false, false);
  const runtime::Executor ex(t, runtime::placeholder_bindings(t));
  auto count = [&](int tokens, int seqs, const std::string& prefix) {
    int n = 0;
    for (const runtime::LaunchRecord& r : ex.record({tokens, seqs, 100}))
      if (r.kernel >= 0 && t.kernels.at(size_t(r.kernel)).name.rfind(prefix, 0) == 0)
        ++n;
    return n;
  };
  const int layers = int(cfg.num_hidden_layers);
  for (auto [tokens, seqs] : {std::pair{1, 1}, std::pair{3, 3}, std::pair{8, 8}}) {
    CAPTURE(tokens);
    CHECK(count(tokens, seqs, "qkv_rope_decode") == layers);
    CHECK(count(tokens, seqs,
                tokens == 1 ? "qkv_rope_decode_k64_q64_k32_v32_t1"
                            : "qkv_rope_decode_chain_k64_q64_k32_v32_t8") == layers);
    CHECK(count(tokens, seqs, "qkv_decode") == 0);
    CHECK(count(tokens, seqs, "rope_yarn") == 0);
    CHECK(count(tokens, seqs, "kv_write") == 0);
  }
  CHECK(count(12, 12, "rope_yarn_qk_kv") == layers);
  CHECK(count(12, 12, "qkv_rope_decode") == 0);
  CHECK(count(3, 1, "qkv_decode") == layers);
  CHECK(count(3, 1, "rope_yarn_qk_q") == layers);
  CHECK(count(3, 1, "kv_write") == 2 * layers);
  CHECK(count(3, 1, "qkv_rope_decode") == 0);
}

TEST_CASE("decode steps run lm_head on tensor cores, o_proj from 2 tokens, FMA for split") {
  const models::ModelConfig cfg =
      models::ModelConfig::load(testing::source_dir() / "examples/tiny/config.json");
  const ir::Graph g = final_graph(cfg, variants()[1]);
  const auto names = decode_kernel_names;
  auto count = [](const std::vector<std::string>& ns, const std::string& prefix) {
    return std::count_if(ns.begin(), ns.end(),
                         [&](const std::string& n) { return n.rfind(prefix, 0) == 0; });
  };
  const int layers = int(cfg.num_hidden_layers);
  const std::string lm_mma =
      fmt::format("linear_k{}_n{}_nobias_t8_mma_", cfg.hidden_size, cfg.vocab_size);
  const runtime::LaunchTable plain = lower_for(g, 64, false, false);
  for (int tokens : {2, 5, 8}) {
    CAPTURE(tokens);
    const std::vector<std::string> ns = names(plain, tokens);
    CHECK(count(ns, "linear_residual_k64_n64_t8_mma_") == layers);
    CHECK(count(ns, lm_mma) == 1);
    CHECK(count(ns, fmt::format("linear_k{}_n{}", cfg.hidden_size, cfg.vocab_size)) == 1);
  }
  const std::vector<std::string> one = names(plain, 1);
  // o_proj at one token: FMA, its rows resident in shared memory before the wait (sm_90).
  CHECK(count(one, "linear_residual_k64_n64_t1_smem_r8") == layers);
  CHECK(count(one, "linear_residual_k64_n64_t8_mma_") == 0);
  CHECK(count(one, lm_mma) == 1);
  // Split (fp32-grade) activations keep the FMA kernels of the linears at every size (attention
  // runs its tensor-core kernels with operand pairs).
  const runtime::LaunchTable split = lower_for(g, 64, true, false);
  for (int tokens : {1, 2, 8}) {
    CAPTURE(tokens);
    const std::vector<std::string> ns = names(split, tokens);
    CHECK(std::none_of(ns.begin(), ns.end(), [](const std::string& n) {
      return n.find("_mma_") != std::string::npos && !n.starts_with("attention_");
    }));
    CHECK(std::count_if(ns.begin(), ns.end(), [](const std::string& n) {
            return n.starts_with("attention_decode_mma_") && n.ends_with("_x3");
          }) == layers);
  }
  CHECK(count(names(split, 1), "linear_residual_k64_n64_t1_smem_r8") == layers);
  // Plans for an architecture before sm_90 (no bulk copies) keep the streaming kernel.
  const compiler::MemoryPlan mem =
      compiler::plan_memory(g, {{ir::dims::kTokens, 64},
                                {ir::dims::kSeqs, kMaxBatch},
                                {ir::dims::kTableBlocks, (kMaxSeq + 15) / 16}});
  codegen::LoweringContext ctx;
  ctx.max_tokens = 64;
  ctx.max_seqs = int(kMaxBatch);
  ctx.max_seq = kMaxSeq;
  ctx.wgmma = false;
  ctx.memory = &mem;
  codegen::KernelSet ks;
  const runtime::LaunchTable sm80 = codegen::lower_graph(g, ks, ctx);
  CHECK(count(names(sm80, 1), "linear_residual_k64_n64_t1_smem") == 0);
  CHECK(count(names(sm80, 1), "linear_residual_k64_n64_t1") == layers);
}

TEST_CASE("XSERV_PROFILE_REPEAT's executor repeats the named kernel's launches in place") {
  const models::ModelConfig cfg =
      models::ModelConfig::load(testing::source_dir() / "examples/tiny/config.json");
  const ir::Graph g = final_graph(cfg, variants()[1]);
  const runtime::LaunchTable t = lower_for(g, 64, false, false);
  runtime::Executor ex(t, runtime::placeholder_bindings(t));
  const std::vector<runtime::LaunchRecord> base = ex.record({1, 1, 10});
  ex.set_repeat("attention_decode", 3);
  const std::vector<runtime::LaunchRecord> rep = ex.record({1, 1, 10});
  auto is_attn = [&](const runtime::LaunchRecord& r) {
    return r.kernel >= 0 &&
           t.kernels.at(size_t(r.kernel)).name.find("attention_decode") != std::string::npos;
  };
  const auto attn = std::count_if(base.begin(), base.end(), is_attn);
  CHECK(attn == cfg.num_hidden_layers);
  REQUIRE(rep.size() == base.size() + size_t(2 * attn));
  // The same sequence with each attention launch three times in a row, arguments unchanged.
  size_t j = 0;
  for (const runtime::LaunchRecord& r : base) {
    for (int i = 0; i < (is_attn(r) ? 3 : 1); ++i, ++j) {
      REQUIRE(j < rep.size());
      CHECK(rep[j].kernel == r.kernel);
      CHECK(rep[j].grid == r.grid);
      CHECK(rep[j].args == r.args);
    }
  }
  ex.set_repeat("", 2);
  CHECK(ex.record({1, 1, 10}).size() == base.size());
}

TEST_CASE("the 120b's decode kernels on sm_90 take the gemms' canonical order when asked") {
  // --gemm-order canonical: the MoE rows (MXFP4, compile's default), lm_head and o_proj at one
  // token and at 2-8 (wg_splitk: o_proj 8 K splits, lm_head 1) in gemm_wg's order, so that a
  // token's sums are the gemms' bits (GPU test: canonical_order_gpu_test.cpp); qkv and the
  // router fused and chained. The default order keeps the fastest kernels, none of them chained
  // but qkv's at 2-8 tokens (its tensor-core kernel is the chained one).
  const models::ModelConfig cfg =
      models::ModelConfig::load(testing::source_dir() / "examples/gpt-oss-120b/config.json");
  const ir::Graph g = final_graph(cfg, variants()[1]);
  const runtime::LaunchTable fast = lower_for(g, 64, false, true, runtime::ExpertFormat::Mxfp4);
  for (const runtime::PlanKernel& k : fast.kernels)
    CHECK((k.name.find("_chain") == std::string::npos ||
           k.name.starts_with("qkv_rope_decode_chain_k2880_q4096_k512_v512_t8")));
  const runtime::LaunchTable t = lower_for(g, 64, false, false, runtime::ExpertFormat::Mxfp4, true);
  auto names = [&](int tokens) { return decode_kernel_names(t, tokens); };
  auto count = [](const std::vector<std::string>& ns, const std::string& part) {
    return std::count_if(ns.begin(), ns.end(),
                         [&](const std::string& n) { return n.find(part) != std::string::npos; });
  };
  const int layers = int(cfg.num_hidden_layers);
  CHECK(codegen::wg_splitk(4096, 2880) == 8);
  for (int tokens : {1, 8}) {
    CAPTURE(tokens);
    const std::vector<std::string> ns = names(tokens);
    CHECK(count(ns, "moe_gate_up_") == layers);
    CHECK(count(ns, "_mma_g8_s1_c8_t2_") == layers); // moe_gate_up (one chain over K)
    CHECK(count(ns, "_mma_g4_s1_c8_t2_") == layers); // moe_down_part
    CHECK(count(ns, "_chain") >= 2 * layers);
    // from 7 tokens an expert a block with the tokens as columns, in the same chains
    CHECK(count(ns, "_cols_chain") == (tokens >= codegen::kMoeColsFrom ? 2 * layers : 0));
    CHECK(count(ns, "linear_k2880_n201088_nobias_t8_mma_g2_s1_r4_a16_chain") == 1); // lm_head
    CHECK(count(ns, tokens == 1
                        ? "linear_residual_k4096_n2880_t1_smem_r24_a16_chain"
                        : "linear_residual_k4096_n2880_t8_mma_g2_s8_r4_a16_chain") == layers);
    // qkv (+ rope and the cache writes) and the router (+ its norm and top-k) fused as in the
    // default plan, but chained in the gemms' K splits: q's 5, k's and v's 9, the router's 9.
    CHECK(count(ns, fmt::format("qkv_rope_decode_chain_k2880_q4096_k512_v512_t{}_c5x9", tokens)) ==
          layers);
    CHECK(count(ns, "rmsnorm_router_topk_chain_d2880_e128_k4_c9") == layers);
    CHECK(count(ns, "qkv_rope_decode_k") == 0);
    CHECK(count(ns, "rmsnorm_router_topk_d") == 0);
    CHECK(count(ns, "rmsnorm_linear") == 0);
    CHECK(count(ns, "gemmwg_") == 0);
  }
  // Above 8 tokens the gemms, in the same K splits.
  const std::vector<std::string> ns = names(16);
  CHECK(count(ns, "qkv_rope_decode") == 0);
  CHECK(count(ns, "norm_router_topk") == 0);
  CHECK(count(ns, "gemmwg_store_k2880_n4096_t64_m64_s4_nobias_bf16_splitk5") == layers);
  CHECK(count(ns, "gemmwg_store_k2880_n128_t64_m64_s4_nobias_bf16_splitk9") == layers);
}
