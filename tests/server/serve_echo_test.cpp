// Echoed completions over real HTTP: the prompt's text and its tokens' log-probabilities as
// loglikelihood clients (lm-evaluation-harness's local-completions) read them.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/server/tiny_server.h"

using namespace xserv;
using namespace xserv::testing;
using Json = nlohmann::json;

TEST_CASE("serve: an echoed completion scores its prompt as loglikelihood clients read it") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s;
  // lm-evaluation-harness's local-completions loglikelihood request: the context and the
  // continuation as one prompt, one token, echo and logprobs; it reads the continuation's
  // entries of token_logprobs (and top_logprobs for is_greedy).
  const std::string prompt = "The quick brown fox jumps over";
  HttpResponse a = s.post("/v1/completions", Json{{"prompt", prompt},
                                                  {"max_tokens", 1},
                                                  {"temperature", 0},
                                                  {"logprobs", 2},
                                                  {"echo", true}}
                                                 .dump());
  REQUIRE(a.status == 200);
  const Json ja = Json::parse(a.body);
  const Json& lp = ja["choices"][0]["logprobs"];
  const size_t n = ja["usage"]["prompt_tokens"].get<size_t>();
  REQUIRE(n >= 4);
  CHECK(ja["usage"]["completion_tokens"] == 1);
  const std::string text = ja["choices"][0]["text"].get<std::string>();
  CHECK(text.rfind(prompt, 0) == 0);
  REQUIRE(lp["tokens"].size() == n + 1);
  REQUIRE(lp["token_logprobs"].size() == n + 1);
  REQUIRE(lp["top_logprobs"].size() == n + 1);
  REQUIRE(lp["text_offset"].size() == n + 1);
  CHECK(lp["token_logprobs"][0].is_null());
  CHECK(lp["top_logprobs"][0].is_null());
  std::string spelled;
  for (size_t i = 0; i <= n; ++i) {
    CAPTURE(i);
    CHECK(lp["text_offset"][i] == spelled.size());
    spelled += lp["tokens"][i].get<std::string>();
    if (i == 0)
      continue;
    const double v = lp["token_logprobs"][i].get<double>();
    CHECK(v <= 0.0);
    CHECK(lp["top_logprobs"][i].size() >= 1);
    CHECK(lp["top_logprobs"][i].size() <= 2);
    double best = -INFINITY;
    for (const auto& [tok, x] : lp["top_logprobs"][i].items())
      best = std::max(best, x.get<double>());
    CHECK(v <= best + 1e-6);
    const std::string tok = lp["tokens"][i].get<std::string>();
    if (lp["top_logprobs"][i].contains(tok))
      CHECK(lp["top_logprobs"][i][tok].get<double>() == doctest::Approx(v));
  }
  CHECK(spelled == text);
  // Position p's row, reached as the last token of a prompt of the first p + 1 tokens: its
  // first token's alternatives are the echoed ones of token p + 1, to the bit (the interpreter
  // gives a position the same row in a chunk as alone: docs/TESTING.md).
  const Json ids = Json::parse(s.post("/tokenize", Json{{"prompt", prompt}}.dump()).body)["tokens"];
  REQUIRE(ids.size() == n);
  for (size_t p : {size_t(0), n / 2, n - 2}) {
    CAPTURE(p);
    Json head = Json::array();
    for (size_t i = 0; i <= p; ++i)
      head.push_back(ids[i]);
    HttpResponse b = s.post("/v1/completions", Json{{"prompt", head},
                                                    {"max_tokens", 1},
                                                    {"temperature", 0},
                                                    {"logprobs", 2},
                                                    {"ignore_eos", true}}
                                                   .dump());
    REQUIRE(b.status == 200);
    const Json jb = Json::parse(b.body);
    const Json& top = jb["choices"][0]["logprobs"]["top_logprobs"][0];
    REQUIRE(top.size() == lp["top_logprobs"][p + 1].size());
    for (const auto& [tok, x] : top.items())
      CHECK(lp["top_logprobs"][p + 1].at(tok).get<double>() == x.get<double>());
  }
  // Tokens that are pieces of a character are named by their bytes ("bytes:\\xNN..."), so that
  // no name is a replacement character and distinct alternatives keep distinct keys.
  HttpResponse u = s.post("/v1/completions", Json{{"prompt", "\u9ce5\u7378\u6232\u756b "
                                                             "\U0001f99c\U0001fab8 \u0f00"},
                                                  {"max_tokens", 2},
                                                  {"temperature", 0},
                                                  {"logprobs", 3},
                                                  {"echo", true}}
                                                 .dump());
  REQUIRE(u.status == 200);
  const Json ju = Json::parse(u.body)["choices"][0]["logprobs"];
  bool pieces = false;
  for (size_t i = 0; i < ju["tokens"].size(); ++i) {
    const std::string t = ju["tokens"][i].get<std::string>();
    CHECK(t.find("\xef\xbf\xbd") == std::string::npos); // U+FFFD
    pieces = pieces || t.rfind("bytes:\\x", 0) == 0;
    if (i > 0)
      CHECK(ju["top_logprobs"][i].size() == 3);
  }
  CHECK(pieces); // the prompt's rare characters are split into byte tokens
  // max_tokens 0: the prompt's entries alone, as OpenAI's scoring requests had them.
  HttpResponse z =
      s.post("/v1/completions",
             Json{{"prompt", prompt}, {"max_tokens", 0}, {"logprobs", 2}, {"echo", true}}.dump());
  REQUIRE(z.status == 200);
  const Json jz = Json::parse(z.body);
  CHECK(jz["choices"][0]["text"] == prompt);
  CHECK(jz["choices"][0]["finish_reason"] == "length");
  CHECK(jz["usage"]["completion_tokens"] == 0);
  const Json& zl = jz["choices"][0]["logprobs"];
  REQUIRE(zl["token_logprobs"].size() == n);
  for (size_t i = 1; i < n; ++i)
    CHECK(zl["token_logprobs"][i].get<double>() == lp["token_logprobs"][i].get<double>());
  CHECK(s.post("/v1/completions", Json{{"prompt", prompt}, {"max_tokens", 0}}.dump()).status ==
        400);
  // Echo alone: the prompt's text leads, no scores; streamed, it comes with the first chunk.
  HttpResponse c = s.post(
      "/v1/completions",
      Json{{"prompt", prompt}, {"max_tokens", 3}, {"temperature", 0}, {"echo", true}}.dump());
  REQUIRE(c.status == 200);
  const Json jc = Json::parse(c.body);
  CHECK(jc["choices"][0]["text"].get<std::string>().rfind(prompt, 0) == 0);
  CHECK(jc["choices"][0]["logprobs"].is_null());
  HttpResponse d = s.post("/v1/completions", Json{{"prompt", prompt},
                                                  {"max_tokens", 3},
                                                  {"temperature", 0},
                                                  {"echo", true},
                                                  {"stream", true}}
                                                 .dump());
  const auto events = sse_data(d.body);
  REQUIRE(events.size() >= 2);
  CHECK(Json::parse(events[0])["choices"][0]["text"].get<std::string>().rfind(prompt, 0) == 0);
  std::string streamed;
  for (size_t i = 0; i + 1 < events.size(); ++i)
    streamed += Json::parse(events[i])["choices"][0]["text"].get<std::string>();
  CHECK(streamed == jc["choices"][0]["text"].get<std::string>());
}
