// Single-threaded encoding throughput of the o200k tokenizer, in MB/s of UTF-8 input.
//
// usage: tokenizer_bench [TOKENIZER] [TEXT_FILE]
//   TOKENIZER  checkpoint dir, tokenizer.json or o200k_base.tiktoken
//              (default: $XSERV_DATA or ../shared/data, its o200k_base.tiktoken)
//   TEXT_FILE  text to encode; default: the GSM8K test questions and answers, English-like
//              prose with numbers, repeated to about 8 MB
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "models/tokenizer.h"

namespace {

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in)
    throw xserv::Error("tokenizer_bench: cannot open " + p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The GSM8K questions and answers, one document per line.
std::vector<std::string> gsm8k_documents(const std::filesystem::path& data) {
  std::ifstream in(data / "gsm8k_test.jsonl");
  if (!in)
    throw xserv::Error("tokenizer_bench: cannot open " + (data / "gsm8k_test.jsonl").string());
  std::vector<std::string> docs;
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    docs.push_back(j["question"].get<std::string>() + "\n" + j["answer"].get<std::string>());
  }
  return docs;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

} // namespace

int main(int argc, char** argv) {
  try {
    std::filesystem::path data = XSERV_DATA_DEFAULT;
    if (const char* env = std::getenv("XSERV_DATA"); env && *env)
      data = env;
    std::filesystem::path tok_path = argc > 1 ? argv[1] : (data / "o200k_base.tiktoken").string();
    auto t0 = std::chrono::steady_clock::now();
    auto tok = xserv::models::Tokenizer::load(tok_path);
    std::printf("loaded %s in %.2f s (%zu ids)\n", tok_path.c_str(), seconds_since(t0),
                tok.vocab_size());

    std::vector<std::string> docs;
    if (argc > 2) {
      docs.push_back(slurp(argv[2]));
    } else {
      auto gsm = gsm8k_documents(data);
      size_t bytes = 0;
      while (bytes < (8u << 20))
        for (const auto& d : gsm) {
          docs.push_back(d);
          bytes += d.size();
        }
    }
    std::string whole;
    for (const auto& d : docs)
      whole += d + "\n";

    // Per document, as a server encodes prompts: no sharing of merge caches between calls.
    size_t tokens = 0;
    t0 = std::chrono::steady_clock::now();
    for (const auto& d : docs)
      tokens += tok.encode(d).size();
    double per_doc = seconds_since(t0);
    // One long call: the pre-token cache warms up over the whole text.
    t0 = std::chrono::steady_clock::now();
    size_t tokens_whole = tok.encode(whole).size();
    double one_call = seconds_since(t0);

    double mb = static_cast<double>(whole.size()) / 1e6;
    std::printf("%.2f MB, %zu documents, %zu tokens (%.2f bytes/token)\n", mb, docs.size(),
                tokens_whole,
                static_cast<double>(whole.size()) / static_cast<double>(tokens_whole));
    std::printf("per-document encode: %.2f MB/s (%zu tokens)\n", mb / per_doc, tokens);
    std::printf("single-call encode:  %.2f MB/s\n", mb / one_call);

    // A hostile prompt: one 200 KB pre-token must not stall the quadratic merge (it took well
    // under 2 s when the heap merge went in; tokenizer_test checks only that it round-trips).
    for (char c : {' ', 'a', '='}) {
      const std::string big(200000, c);
      t0 = std::chrono::steady_clock::now();
      const size_t n = tok.encode(big).size();
      std::printf("one 200 KB pre-token of '%c': %.3f s (%zu tokens)\n", c, seconds_since(t0), n);
    }
    return 0;
  } catch (const xserv::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
