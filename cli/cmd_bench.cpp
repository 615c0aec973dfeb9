// `xserv bench`: prefill and decode throughput in llama-bench's shape, from random token ids.
//
// 1. Parse the test grid: prompt sizes (-p), generation length (-n) at context depths (-d),
//    batch sizes for decode (-b), repeats (-r).
// 2. For each test: one untimed warm-up, then r timed repeats. A repeat resets the engine,
//    prefills `depth` random tokens per sequence untimed, then times only engine steps (the
//    engine's Stopwatch: CUDA events on its stream for the GPU, the host clock for the CPU),
//    step by step: one prefill step of p tokens (ppP), or n decode steps of one token per
//    sequence (tgN), the next random inputs made between the timed steps. Steps
//    are greedy ones (Model::step_greedy: the CUDA model picks on the GPU and copies back only
//    the ids, as a decode loop does); no tokenizer and no sampling run inside the timed region,
//    and the next input ids are random.
// 3. Batched decode rows also give time to first token (the prefill of a 1-token prompt for
//    every sequence) and time per output token (median, p99 over steps and repeats).
// 4. --mixed M: each batched decode row again with a prompt chunk of M tokens (one more
//    sequence) in every step, the mixed steps of continuous batching (tgN x B + pM).
#include <algorithm>
#include <iostream>
#include <random>

#include <fmt/format.h>

#include "cli/bench_report.h"
#include "cli/commands.h"
#include "cli/model_source.h"
#include "cli/output_constraint.h"
#include "cli/serving_report.h"
#include "engine/model_bench.h"
#include "server/http_load.h"

namespace xserv::cli {
namespace {

std::vector<int64_t> int_list(const ParsedArgs& args, const std::string& name,
                              std::vector<int64_t> fallback, int64_t lo, int64_t hi) {
  if (!args.has(name))
    return fallback;
  std::vector<int64_t> out;
  for (const auto& s : args.list(name)) {
    char* end = nullptr;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || v < lo || v > hi)
      throw UsageError(fmt::format("{}: '{}' is not an integer in [{}, {}]", name, s, lo, hi));
    out.push_back(v);
  }
  return out;
}

/// `xserv bench --requests N ...`: the serving benchmark, in this process or against --endpoint.
int serving_bench(const ParsedArgs& args) {
  engine::ServingOptions o;
  o.requests = args.get_int("--requests", 256, 1, 1 << 24);
  o.concurrency = args.get_int("--concurrency", 64, 1, 1 << 16);
  o.rate = args.get_double("--rate", 0.0);
  if (!(o.rate >= 0))
    throw UsageError("--rate must be >= 0 requests per second (0: all at once)");
  o.input_len = args.get_int("--input-len", 512, 1, 1 << 24);
  o.output_len = args.get_int("--output-len", 256, 1, 1 << 24);
  o.len_range = args.get_double("--len-range", 0.0);
  if (!(o.len_range >= 0 && o.len_range < 1))
    throw UsageError("--len-range must be in [0, 1)");
  o.seed = static_cast<uint64_t>(args.get_int("--seed", 1, 0, INT64_MAX));
  o.shared_prefix = args.get_int("--shared-prefix", 0, 0, 1 << 24);
  o.turns = args.get_int("--turns", 1, 1, 1 << 16);
  const std::string format = args.get("-o", "md");
  if (format != "md" && format != "json" && format != "csv")
    throw UsageError(fmt::format("-o must be md, json or csv, got '{}'", format));

  // Structured output: every request's whole output follows the grammar (engine only).
  const std::optional<engine::GrammarSpec> grammar = output_grammar(args);
  if (grammar && args.has("--endpoint"))
    throw UsageError(fmt::format("{} constrains the in-process engine's requests; a server's "
                                 "requests carry their own response_format",
                                 grammar->field));
  if (args.has("--endpoint")) {
    server::Endpoint ep;
    ep.url = args.get("--endpoint");
    ep.model = args.get("--model", "");
    ep.api_key = args.get("--api-key", "");
    o.vocab = args.get_int("--vocab", 199998, 1, 1 << 24);
    o.disconnect = args.get_double("--disconnect", 0.0);
    if (!(o.disconnect >= 0 && o.disconnect <= 1))
      throw UsageError("--disconnect must be a fraction in [0, 1]");
    const engine::Workload w = engine::make_workload(o);
    double seconds = 0;
    const auto records = server::run_http_load(ep, w, o, &seconds);
    std::cout << render_serving(engine::summarize(records, seconds, w.turn), o, ep.url, {}, format)
              << std::flush;
    return 0;
  }

  if (args.positional().empty())
    throw UsageError("give a plan or model directory, or --endpoint URL");
  ModelSource src = resolve_source(args.positional()[0], args);
  // The longest request: the shared prefix, and each turn's new tokens and reply.
  const int64_t need_seq =
      o.shared_prefix +
      o.turns * (static_cast<int64_t>(double(o.input_len) * (1 + o.len_range)) + 1 +
                 static_cast<int64_t>(double(o.output_len) * (1 + o.len_range)) + 1);
  if (!src.plan) {
    src.max_seq = need_seq;
    src.max_batch = std::min<int64_t>(o.concurrency, 256);
  } else if (need_seq > src.max_seq) {
    throw UsageError(
        fmt::format("requests of up to {} tokens need --max-seq {}, the plan allows {} "
                    "(compile with a larger --max-seq)",
                    need_seq, need_seq, src.max_seq));
  }
  auto model = make_model(src, args);
  o.vocab = model->config().vocab_size;
  std::shared_ptr<const engine::Constraint> constraint;
  if (grammar)
    constraint = compile_output(*grammar, load_tokenizer(src, args), *model, false);
  engine::EngineOptions eo;
  eo.max_running = args.get_int("--max-running", 0, 0, 1 << 20);
  eo.max_tokens_per_step = args.get_int("--max-tokens-per-step", 8192, 1, 1 << 24);
  eo.admit_batch = args.get_int("--admit-batch", 1, 1, 1 << 16);
  engine_kv_options(args, eo);
  const engine::Workload w = engine::make_workload(o);
  // Warm-up: one short request, so that kernel loading and first launches stay out of the run.
  {
    engine::ServingOptions wo = o;
    wo.requests = 1;
    engine::Workload ww = engine::make_workload(wo);
    ww.output_lens[0] = std::min<int64_t>(ww.output_lens[0], 4);
    engine::run_engine_load(*model, ww, wo, eo, nullptr, nullptr, constraint);
  }
  engine::EngineStats st;
  double seconds = 0;
  const auto records = engine::run_engine_load(*model, w, o, eo, &st, &seconds, constraint);
  const double steps = double(std::max<int64_t>(st.steps, 1));
  std::vector<std::pair<std::string, std::string>> extra = {
      {"engine steps", std::to_string(st.steps)},
      {"model time per step (ms)", fmt::format("{:.3f}", st.model_ms / steps)},
      {"engine host time per step (ms)", fmt::format("{:.3f}", st.schedule_ms / steps)},
      {"engine host share of a step",
       fmt::format("{:.2f}%", 100 * st.schedule_ms / std::max(st.model_ms + st.schedule_ms, 1e-9))},
      {"max running", std::to_string(st.kv_rows)},
      {"token budget per step",
       std::to_string(std::max(eo.max_tokens_per_step, st.kv_rows))}, // raised to max running
      {"prefill budget beside decodes", std::to_string(eo.prefill_budget)},
      {"inter-token latency target (ms)",
       eo.itl_target_ms > 0 ? fmt::format("{:g}", eo.itl_target_ms)
       : eo.itl_factor > 0  ? fmt::format("{:g}x the heading batch alone", eo.itl_factor)
                            : std::string("off")},
      {"steps past that target allowed (share of decodes)",
       eo.itl_tail > 0 && (eo.itl_target_ms > 0 || eo.itl_factor > 0)
           ? fmt::format("{:g}", eo.itl_tail)
           : std::string("none")},
      {"admit batch", std::to_string(eo.admit_batch)},
      {"KV blocks (full pool, used at the end)",
       fmt::format("{} of {} blocks of {}", st.kv_blocks_used, st.kv_blocks, st.kv_block_size)},
      {"prefix cache", eo.prefix_caching ? "on" : "off"},
      {"prefix-cache hit tokens / queried",
       fmt::format("{} / {} ({:.1f}%)", st.prefix_hits, st.prefix_queries,
                   100.0 * double(st.prefix_hits) /
                       double(std::max<int64_t>(st.prefix_queries, 1)))},
      {"prefix-cache evictions", std::to_string(st.prefix_evictions)},
      {"preemptions", std::to_string(st.preemptions)}};
  if (grammar)
    extra.emplace_back("structured output",
                       fmt::format("every output follows {}{}; masks picked {}", grammar->field,
                                   grammar->kind == engine::GrammarSpec::Kind::Regex
                                       ? " " + grammar->text
                                       : std::string(),
                                   model->picks_masked() ? "on the device" : "on the host"));
  std::cout << render_serving(engine::summarize(records, seconds, w.turn), o,
                              fmt::format("xserv engine ({})", model->backend()), extra, format)
            << std::flush;
  return 0;
}

} // namespace

int cmd_bench(const ParsedArgs& args) {
  if (args.has("--requests") || args.has("--endpoint"))
    return serving_bench(args);
  const auto prompts = int_list(args, "-p", {512}, 0, 1 << 20);
  const auto gens = int_list(args, "-n", {128}, 0, 1 << 20);
  const auto depths = int_list(args, "-d", {0}, 0, 1 << 24);
  const auto batches = int_list(args, "-b", {1}, 1, 4096);
  const auto mixes = int_list(args, "--mixed", {0}, 0, 1 << 20);
  const int64_t repeats = args.get_int("-r", 5, 1, 1000);
  const std::string format = args.get("-o", "md");
  if (format != "md" && format != "json" && format != "csv")
    throw UsageError(fmt::format("-o must be md, json or csv, got '{}'", format));
  if (args.positional().empty())
    throw UsageError("give a plan or model directory");
  ModelSource src = resolve_source(args.positional()[0], args);
  int64_t need_seq = 1, need_batch = 1;
  const bool any_mixed = std::any_of(mixes.begin(), mixes.end(), [](int64_t m) { return m > 0; });
  for (int64_t d : depths) {
    for (int64_t p : prompts)
      need_seq = std::max(need_seq, d + p);
    for (int64_t n : gens)
      need_seq = std::max(need_seq, d + n + 1);
    for (int64_t m : mixes)
      need_seq = std::max(need_seq, d + m);
  }
  for (int64_t b : batches)
    need_batch = std::max(need_batch, b + (any_mixed ? 1 : 0));
  if (src.plan && (need_seq > src.max_seq || need_batch > src.max_batch))
    throw UsageError(fmt::format("the tests need sequences of {} and batches of {}, the plan "
                                 "allows {} and {} (compile with larger --max-seq/--max-batch)",
                                 need_seq, need_batch, src.max_seq, src.max_batch));
  if (!src.plan) {
    src.max_seq = need_seq;
    src.max_batch = need_batch;
  }
  auto engine = make_model(src, args);
  engine::ModelBench bench(*engine, static_cast<uint64_t>(args.get_int("--seed", 1, 0, INT64_MAX)));
  std::vector<BenchRow> rows;
  auto depth_suffix = [](int64_t d) { return d ? fmt::format(" @ d{}", d) : std::string(); };
  for (int64_t d : depths) {
    for (int64_t p : prompts) {
      if (p == 0)
        continue;
      BenchRow row;
      row.test = fmt::format("pp{}{}", p, depth_suffix(d));
      row.prompt = p;
      row.depth = d;
      bench.prefill(p, d); // warm-up
      for (int64_t r = 0; r < repeats; ++r)
        row.tokens_per_s.push_back(bench.prefill(p, d));
      row.peak_memory_gib = engine->peak_memory_gib();
      rows.push_back(std::move(row));
    }
    for (int64_t n : gens) {
      if (n == 0)
        continue;
      for (int64_t b : batches) {
        BenchRow row;
        row.test =
            fmt::format("tg{}{}{}", n, depth_suffix(d), b > 1 ? fmt::format(" x B{}", b) : "");
        row.gen = n;
        row.depth = d;
        row.batch = b;
        std::vector<double> step_ms, ttft;
        double t = 0;
        bench.decode(n, d, b, step_ms, t); // warm-up
        step_ms.clear();
        for (int64_t r = 0; r < repeats; ++r) {
          row.tokens_per_s.push_back(bench.decode(n, d, b, step_ms, t));
          ttft.push_back(t);
        }
        row.ttft_ms_median = d == 0 ? quantile(ttft, 0.5) : 0;
        row.tpot_ms_median = quantile(step_ms, 0.5);
        row.tpot_ms_p99 = quantile(step_ms, 0.99);
        row.peak_memory_gib = engine->peak_memory_gib();
        rows.push_back(std::move(row));
        // The same decodes sharing each step with a prompt chunk of m tokens: the step time
        // (TPOT) is what their inter-token latency becomes while a prompt is prefilled.
        for (int64_t m : mixes) {
          if (m == 0)
            continue;
          BenchRow mr;
          mr.test = fmt::format("tg{}{} x B{} + p{}", n, depth_suffix(d), b, m);
          mr.gen = n;
          mr.depth = d;
          mr.batch = b;
          mr.prompt = m;
          std::vector<double> mixed_ms;
          bench.mixed(n, d, b, m, mixed_ms); // warm-up
          mixed_ms.clear();
          for (int64_t r = 0; r < repeats; ++r)
            mr.tokens_per_s.push_back(bench.mixed(n, d, b, m, mixed_ms));
          mr.tpot_ms_median = quantile(mixed_ms, 0.5);
          mr.tpot_ms_p99 = quantile(mixed_ms, 0.99);
          mr.peak_memory_gib = engine->peak_memory_gib();
          rows.push_back(std::move(mr));
        }
      }
    }
  }
  BenchModel model = describe_model(engine->config(), engine->backend(), 2.0);
  std::cout << render_bench(model, rows, format) << std::flush;
  return 0;
}

} // namespace xserv::cli
