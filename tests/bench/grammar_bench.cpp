// Structured output's host costs on this CPU: indexing the o200k vocabulary, compiling schemas
// (a 1,000-property one included), and a token mask and a token's acceptance per sequence per
// step while random walks through the grammar generate (median and p99 over every step),
// single-threaded; the grammars include scripts/device/structured.sh's serving ones.
//
// usage: [THREADS=N] [GRAMMAR=part of a name] grammar_bench [TOKENIZER]
//   TOKENIZER  o200k_base.tiktoken or tokenizer.json (default: $XSERV_DATA or ../shared/data)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/error.h"
#include "engine/constraint.h"

namespace {

using Clock = std::chrono::steady_clock;
using xserv::engine::ConstraintRequest;
using xserv::engine::ConstraintState;
using xserv::engine::GrammarSpec;

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, size_t(q * double(v.size())))];
}

std::string wide_schema(int properties) {
  std::string props;
  for (int i = 0; i < properties; ++i)
    props += fmt::format("{}\"field_{}\": {{\"type\": \"{}\"}}", i ? ", " : "", i,
                         i % 3 == 0   ? "integer"
                         : i % 3 == 1 ? "string"
                                      : "boolean");
  return fmt::format(R"({{"type": "object", "properties": {{{}}}, "required": ["field_0"]}})",
                     props);
}

} // namespace

int main(int argc, char** argv) {
  try {
    std::filesystem::path data = XSERV_DATA_DEFAULT;
    if (const char* env = std::getenv("XSERV_DATA"); env && *env)
      data = env;
    const std::filesystem::path tok_path = argc > 1 ? argv[1] : data / "o200k_base.tiktoken";
    const auto tok = xserv::models::Tokenizer::load(tok_path);
    const int64_t vocab = 201088;
    auto t0 = Clock::now();
    // THREADS: the compiler's threads (default 0: the machine's cores).
    const int threads = std::getenv("THREADS") ? std::atoi(std::getenv("THREADS")) : 0;
    xserv::engine::ConstraintCompiler compiler(tok, vocab, {200002, 199999, 200012}, threads);
    std::printf("vocabulary index (%lld ids): %.0f ms\n", static_cast<long long>(vocab),
                us_since(t0) / 1e3);

    using K = GrammarSpec::Kind;
    const std::vector<std::pair<std::string, GrammarSpec>> specs = {
        {"json_object", {K::Json, "", "bench"}},
        {"person schema",
         {K::JsonSchema, R"({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "email": {"type": "string", "format": "email"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 8},
            "address": {"type": "object", "properties": {"city": {"type": "string"},
                        "zip": {"type": "string", "pattern": "[0-9]{5}"}}, "required": ["city"]}},
            "required": ["name", "age"]})",
          "bench"}},
        {"1,000 properties", {K::JsonSchema, wide_schema(1000), "bench"}},
        {"regex", {K::Regex, "[A-Z][a-z]{2,10}( [A-Z][a-z]{2,10}){0,3}, [0-9]{1,5}", "bench"}},
        {"regex [a-z ]+", {K::Regex, "[a-z ]+", "bench"}},
        {"objects",
         {K::JsonSchema, R"({"type": "array", "items": {"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"},
  "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4}},
  "required": ["name", "n"]}})",
          "bench"}},
    };
    std::printf("| grammar | compile ms | mask us median | p99 | accept us median | p99 | steps "
                "|\n|---|---|---|---|---|---|---|\n");
    const char* only = std::getenv("GRAMMAR"); // a part of the names to run, else all
    for (const auto& [name, spec] : specs) {
      if (only && name.find(only) == std::string::npos)
        continue;
      ConstraintRequest req;
      req.output = spec;
      t0 = Clock::now();
      const auto constraint = compiler.compile(req);
      const double compile_ms = us_since(t0) / 1e3;
      std::vector<double> mask_us, accept_us;
      std::vector<uint32_t> words(ConstraintState::mask_words(vocab));
      std::mt19937_64 rng(7);
      for (int walk = 0; walk < 20; ++walk) {
        ConstraintState s(constraint);
        for (int step = 0; step < 200 && s.bound(); ++step) {
          const auto tm = Clock::now();
          s.fill_mask(words);
          mask_us.push_back(us_since(tm));
          std::vector<int32_t> ok;
          for (int64_t t = 0; t < vocab; ++t)
            if (words[size_t(t / 32)] >> (t % 32) & 1u)
              ok.push_back(int32_t(t));
          if (ok.empty())
            break;
          const auto ta = Clock::now();
          const bool taken = s.accept(ok[rng() % ok.size()]);
          accept_us.push_back(us_since(ta));
          if (!taken)
            break;
        }
      }
      std::printf("| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %zu |\n", name.c_str(), compile_ms,
                  quantile(mask_us, 0.5), quantile(mask_us, 0.99), quantile(accept_us, 0.5),
                  quantile(accept_us, 0.99), mask_us.size());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "grammar_bench: %s\n", e.what());
    return 1;
  }
}
