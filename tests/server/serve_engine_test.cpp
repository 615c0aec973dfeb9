// `xserv serve` over the paged engine's serving features: n choices (shared prompt blocks), the
// prefix cache and its metrics, conversations replayed turn by turn through `xserv bench
// --endpoint`, and SSE pings while a stream waits.
#include <doctest/doctest.h>

#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/server/tiny_server.h"

using namespace xserv;
using namespace xserv::testing;
using Json = nlohmann::json;

TEST_CASE("serve: n choices for chat and completions, streamed and whole") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s({}, 4);
  // Greedy: every choice is the n = 1 answer; usage counts every choice's tokens.
  const Json one = Json::parse(s.post("/v1/chat/completions", kChat).body);
  Json body = Json::parse(kChat);
  body["n"] = 3;
  HttpResponse r = s.post("/v1/chat/completions", body.dump());
  INFO(r.body);
  REQUIRE(r.status == 200);
  Json j = Json::parse(r.body);
  REQUIRE(j["choices"].size() == 3);
  for (int c = 0; c < 3; ++c) {
    CHECK(j["choices"][c]["index"] == c);
    CHECK(j["choices"][c]["message"] == one["choices"][0]["message"]);
    CHECK(j["choices"][c]["finish_reason"] == "length");
  }
  CHECK(j["usage"]["completion_tokens"] == 18);
  CHECK(j["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]);

  // Sampled with a seed: the stream's choices, put together by index, are the whole
  // response's, and the choices differ from one another (their samplers draw apart).
  body = {{"model", "gpt-oss"}, {"prompt", "Once upon"},
          {"max_tokens", 12},   {"temperature", 1.0},
          {"seed", 7},          {"n", 4}};
  HttpResponse whole = s.post("/v1/completions", body.dump());
  REQUIRE(whole.status == 200);
  const Json w = Json::parse(whole.body);
  REQUIRE(w["choices"].size() == 4);
  CHECK(w["usage"]["completion_tokens"] == 48);
  body["stream"] = true;
  HttpResponse st = s.post("/v1/completions", body.dump());
  REQUIRE(st.status == 200);
  std::vector<std::string> text(4);
  std::vector<std::string> finish(4);
  std::vector<int> chunks(4, 0);
  for (const std::string& e : sse_data(st.body)) {
    if (e == "[DONE]")
      continue;
    const Json c = Json::parse(e);
    for (const Json& ch : c["choices"]) {
      const int i = ch["index"].get<int>();
      REQUIRE(i >= 0);
      REQUIRE(i < 4);
      text[size_t(i)] += ch["text"].get<std::string>();
      if (ch["finish_reason"].is_string())
        finish[size_t(i)] = ch["finish_reason"].get<std::string>();
      else
        ++chunks[size_t(i)];
    }
  }
  std::set<std::string> distinct;
  for (size_t c = 0; c < 4; ++c) {
    CHECK(text[c] == w["choices"][c]["text"].get<std::string>());
    CHECK(finish[c] == "length");
    CHECK(chunks[c] == 12); // one chunk per token, even one whose text is empty
    distinct.insert(text[c]);
  }
  CHECK(distinct.size() > 1);

  // More choices than the server runs at once: 400 naming n.
  body = Json::parse(kChat);
  body["n"] = 5;
  HttpResponse big = s.post("/v1/chat/completions", body.dump());
  CHECK(big.status == 400);
  CHECK(error_of(big)["param"] == "n");
  body["n"] = 0;
  CHECK(s.post("/v1/chat/completions", body.dump()).status == 400);
}

TEST_CASE("serve: a repeated prompt is served from the prefix cache, and /metrics says so") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s;
  Json body = Json::parse(kChat);
  body["messages"][0]["content"] = std::string(200, 'x') + " and then some more words to cache";
  body["max_tokens"] = 2;
  const HttpResponse a = s.post("/v1/chat/completions", body.dump());
  REQUIRE(a.status == 200);
  const HttpResponse b = s.post("/v1/chat/completions", body.dump());
  REQUIRE(b.status == 200);
  CHECK(Json::parse(a.body)["choices"] == Json::parse(b.body)["choices"]);
  const engine::EngineStats st = s.server.stats();
  const int64_t prompt = Json::parse(a.body)["usage"]["prompt_tokens"].get<int64_t>();
  CHECK(st.prefix_queries == 2 * prompt);
  // The second request finds every full block of the first's prompt (16 positions each).
  CHECK(st.prefix_hits == (prompt - 1) / 16 * 16);
  CHECK(st.prefix_hits >= 16);
  const std::string met = http(s.port, "GET", "/metrics").body;
  CHECK(met.find("xserv:prefix_cache_hits_total " + std::to_string(st.prefix_hits)) !=
        std::string::npos);
  CHECK(met.find("xserv:prefix_cache_queries_total " + std::to_string(2 * prompt)) !=
        std::string::npos);
}

TEST_CASE("serve: xserv bench --endpoint streams conversations turn by turn through the server") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s;
  const std::string common = "bench --endpoint http://127.0.0.1:" + std::to_string(s.port) +
                             " --model gpt-oss --vocab 1000 --requests 6 --concurrency 3 "
                             "--input-len 20 --output-len 4 -o json";
  RunResult r = run_xserv(common + " --turns 2", "", true);
  INFO(r.err);
  REQUIRE(r.code == 0);
  const Json j = Json::parse(r.out);
  CHECK(j["completed"] == 6);
  CHECK(j["failed"] == 0);
  CHECK(j["turns"] == 2);
  REQUIRE(j["ttft_by_turn"].size() == 2);
  // A second turn's prompt begins with its first turn's: its full blocks come from the cache.
  CHECK(s.server.stats().prefix_hits >= 3 * 16);
  CHECK(s.server.stats().generated_tokens == 6 * 4);

  RunResult cut = run_xserv(common + " --disconnect 1 --output-len 40", "", true);
  INFO(cut.err);
  REQUIRE(cut.code == 0);
  CHECK(Json::parse(cut.out)["disconnected"] == 6);

  RunResult tls = run_xserv("bench --endpoint https://127.0.0.1:1 --requests 1", "", true);
  CHECK(tls.code == 2);
  CHECK(tls.err.find("https is not supported") != std::string::npos);
  RunResult path = run_xserv("bench --endpoint http://127.0.0.1:1/v2 --requests 1", "", true);
  CHECK(path.code == 2);
}

TEST_CASE("serve: a stream kept waiting gets SSE pings in well-formed chunks, then its events") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s;
  s.model.set_open(false); // the request waits at its first step
  Json body = Json::parse(kChat);
  body["stream"] = true;
  Socket sock(s.port);
  sock.send_all(http_request("POST", "/v1/chat/completions", body.dump()));
  // The server pings a stream that has had nothing to say for a second.
  std::string raw;
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (raw.find(": ping") == std::string::npos && std::chrono::steady_clock::now() < limit) {
    pollfd p{sock.fd, POLLIN, 0};
    if (::poll(&p, 1, 1000) > 0) {
      const std::string part = sock.read_some();
      REQUIRE(!part.empty());
      raw += part;
    }
  }
  REQUIRE(raw.find(": ping") != std::string::npos);
  s.model.set_open(true);
  raw += read_until_closed(sock, std::chrono::seconds(60)).bytes;
  const std::vector<HttpResponse> rs = parse_responses(raw);
  REQUIRE(rs.size() == 1);
  CHECK(rs[0].status == 200);
  CHECK(rs[0].body.find(": ping\n\n") != std::string::npos);
  const auto events = sse_data(rs[0].body); // dechunk checked every chunk's framing
  REQUIRE(events.size() >= 3);
  CHECK(events.back() == "[DONE]");
  CHECK(Json::parse(events[events.size() - 2])["choices"][0]["finish_reason"] == "length");
}

TEST_CASE("serve: logit_bias and penalties reach the engine: a biased token is every token, "
          "greedy and sampled") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s;
  s.model.set_open(true);
  // Id 42 is "K" in o200k: forced by +100, five times over, whatever else the request asks.
  for (const Json& extra : {Json{{"temperature", 0}}, Json{{"temperature", 1}, {"seed", 3}},
                            Json{{"presence_penalty", 0.5}, {"repetition_penalty", 1.1}}}) {
    Json body = {{"prompt", "Hello"}, {"max_tokens", 5}, {"logit_bias", {{"42", 100}}}};
    body.update(extra);
    const HttpResponse r = s.post("/v1/completions", body.dump());
    REQUIRE_MESSAGE(r.status == 200, r.body);
    CHECK(Json::parse(r.body)["choices"][0]["text"] == "KKKKK");
  }
  // An id past the vocabulary is the request's error, named.
  const HttpResponse bad = s.post(
      "/v1/completions", Json{{"prompt", "x"}, {"logit_bias", {{"999999", 1}}}}.dump());
  CHECK(bad.status == 400);
  CHECK(error_of(bad)["param"] == "logit_bias.999999");
}
