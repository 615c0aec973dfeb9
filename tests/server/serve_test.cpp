// `xserv serve` end to end over real HTTP on 127.0.0.1: every endpoint, streaming and not, the
// rejections, a disconnect mid-stream, draining, and SIGTERM on the real binary.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <sys/wait.h>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/server/tiny_server.h"

namespace fs = std::filesystem;
using namespace xserv;
using namespace xserv::testing;
using Json = nlohmann::json;

TEST_CASE("serve: health before and after loading, models, metrics") {
  XSERV_REQUIRE_DATA(data);
  server::ServeOptions opt;
  opt.log_requests = false;
  server::Server server(opt);
  const int port = server.listen("127.0.0.1", 0);
  CHECK(http(port, "GET", "/health").status == 503);
  CHECK(http(port, "POST", "/v1/chat/completions", kChat).status == 503);
  GatedModel model(2, 128);
  server.attach(model, models::Tokenizer::load(data / "o200k_base.tiktoken"));
  CHECK(http(port, "GET", "/health").status == 200);
  HttpResponse m = http(port, "GET", "/v1/models");
  CHECK(m.status == 200);
  CHECK(Json::parse(m.body)["data"][0]["id"] == "gpt-oss");
  CHECK(Json::parse(m.body)["data"][0]["max_model_len"] == 128);
  HttpResponse none = http(port, "GET", "/nowhere");
  CHECK(none.status == 404);
  error_of(none);
  HttpResponse met = http(port, "GET", "/metrics");
  CHECK(met.status == 200);
  for (const char* name :
       {"xserv:time_to_first_token_seconds_bucket", "xserv:inter_token_latency_seconds_bucket",
        "xserv:e2e_request_latency_seconds_count", "xserv:request_queue_time_seconds_count 0",
        "xserv:num_requests_running 0", "xserv:num_requests_waiting 0", "xserv:kv_blocks_in_use 0",
        "xserv:kv_block_size 16", "xserv:kv_cache_usage_perc 0",
        "xserv:prefix_cache_queries_total 0", "xserv:num_preemptions_total 0",
        "xserv:prompt_tokens_total 0", "xserv:generation_tokens_total 0",
        "xserv:request_success_total{finished_reason=\"stop\"} 0"})
    CHECK_MESSAGE(met.body.find(name) != std::string::npos, name);
  server.drain(std::chrono::milliseconds(0));
}

TEST_CASE("serve: chat completions, plain and streamed with usage") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s;
  HttpResponse r = s.post("/v1/chat/completions", kChat);
  INFO(r.body);
  REQUIRE(r.status == 200);
  Json j = Json::parse(r.body);
  CHECK(j["object"] == "chat.completion");
  CHECK(j["choices"][0]["message"]["role"] == "assistant");
  CHECK(j["choices"][0]["message"]["content"].is_string()); // garbage text degrades to content
  CHECK(j["choices"][0]["finish_reason"] == "length");
  CHECK(j["usage"]["completion_tokens"] == 6);
  CHECK(j["usage"]["prompt_tokens"].get<int>() > 10);
  CHECK(j["usage"]["total_tokens"] ==
        j["usage"]["prompt_tokens"].get<int>() + j["usage"]["completion_tokens"].get<int>());

  Json body = Json::parse(kChat);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  body["logprobs"] = true;
  body["top_logprobs"] = 2;
  HttpResponse st = s.post("/v1/chat/completions", body.dump());
  REQUIRE(st.status == 200);
  CHECK(st.headers.find("text/event-stream") != std::string::npos);
  auto events = sse_data(st.body);
  REQUIRE(events.size() >= 4);
  CHECK(events.back() == "[DONE]");
  Json first = Json::parse(events.front());
  CHECK(first["object"] == "chat.completion.chunk");
  CHECK(first["choices"][0]["delta"]["role"] == "assistant");
  Json usage = Json::parse(events[events.size() - 2]);
  CHECK(usage["choices"].empty());
  CHECK(usage["usage"]["completion_tokens"] == 6);
  Json fin = Json::parse(events[events.size() - 3]);
  CHECK(fin["choices"][0]["finish_reason"] == "length");
  // Streamed content equals the non-streamed one (greedy), and every token had logprobs.
  std::string content;
  int logprob_entries = 0;
  for (size_t i = 1; i + 2 < events.size(); ++i) {
    Json c = Json::parse(events[i]);
    content += c["choices"][0]["delta"].value("content", "");
    if (c["choices"][0]["logprobs"].is_object())
      for (const Json& e : c["choices"][0]["logprobs"]["content"]) {
        CHECK(e["top_logprobs"].size() == 2);
        ++logprob_entries;
      }
  }
  CHECK(content == j["choices"][0]["message"]["content"].get<std::string>());
  CHECK(logprob_entries == 6);
}

TEST_CASE("serve: responses, plain and streamed as named, numbered events") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s;
  const std::string body = R"({"model": "gpt-oss", "input": "Hi", "instructions": "Be brief.",
    "max_output_tokens": 6, "temperature": 0})";
  HttpResponse r = s.post("/v1/responses", body);
  INFO(r.body);
  REQUIRE(r.status == 200);
  Json j = Json::parse(r.body);
  CHECK(j["object"] == "response");
  CHECK(j["id"].get<std::string>().rfind("resp_", 0) == 0);
  CHECK(j["status"] == "incomplete"); // six ids of garbage: cut by max_output_tokens
  CHECK(j["incomplete_details"]["reason"] == "max_output_tokens");
  CHECK(j["instructions"] == "Be brief.");
  CHECK(j["max_output_tokens"] == 6);
  REQUIRE(j["output"].size() == 1);
  CHECK(j["output"][0]["type"] == "message"); // garbage text degrades to content
  CHECK(j["output"][0]["role"] == "assistant");
  const std::string text = j["output"][0]["content"][0]["text"];
  CHECK(j["usage"]["output_tokens"] == 6);
  CHECK(j["usage"]["input_tokens"].get<int>() > 10);
  CHECK(j["usage"]["total_tokens"] == j["usage"]["input_tokens"].get<int>() + 6);
  // The same prompt as the chat request that means the same.
  HttpResponse chat = s.post("/v1/chat/completions", R"({"messages": [
    {"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    "max_tokens": 6, "temperature": 0})");
  REQUIRE(chat.status == 200);
  Json cj = Json::parse(chat.body);
  CHECK(cj["usage"]["prompt_tokens"] == j["usage"]["input_tokens"]);
  CHECK(cj["choices"][0]["message"]["content"] == text);

  Json sb = Json::parse(body);
  sb["stream"] = true;
  HttpResponse st = s.post("/v1/responses", sb.dump());
  REQUIRE(st.status == 200);
  CHECK(st.headers.find("text/event-stream") != std::string::npos);
  // Each event: an `event: TYPE` line, then its data with the same type and the next number.
  std::vector<std::string> names;
  for (size_t i = 0; (i = st.body.find("event: ", i)) != std::string::npos; ++i)
    names.push_back(st.body.substr(i + 7, st.body.find('\n', i) - i - 7));
  const auto events = sse_data(st.body);
  REQUIRE(events.size() == names.size());
  REQUIRE(events.size() >= 8);
  std::string streamed;
  for (size_t i = 0; i < events.size(); ++i) {
    Json e = Json::parse(events[i]);
    CHECK(e["type"] == names[i]);
    CHECK(e["sequence_number"] == int(i));
    if (e["type"] == "response.output_text.delta")
      streamed += e["delta"].get<std::string>();
  }
  CHECK(names.front() == "response.created");
  CHECK(names[1] == "response.in_progress");
  CHECK(Json::parse(events.front())["response"]["status"] == "in_progress");
  CHECK(names.back() == "response.incomplete");
  CHECK(st.body.find("[DONE]") == std::string::npos);
  Json last = Json::parse(events.back())["response"];
  CHECK(last["usage"]["output_tokens"] == 6);
  CHECK(last["output"][0]["content"][0]["text"] == text);
  CHECK(streamed == text);

  HttpResponse bad = s.post("/v1/responses", R"({"input": "x", "max_output_tokens": 0})");
  CHECK(bad.status == 400);
  CHECK(error_of(bad)["param"] == "max_output_tokens");
  HttpResponse prev = s.post("/v1/responses", R"({"input": "x", "previous_response_id": "r"})");
  CHECK(prev.status == 400);
  CHECK(error_of(prev)["param"] == "previous_response_id");
}

TEST_CASE("serve: a tool call round trip gives a well-formed answer") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s;
  HttpResponse r = s.post("/v1/chat/completions", R"({
    "messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "reasoning": "Use the tool.",
       "tool_calls": [{"id": "call_1", "type": "function",
                       "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 21}"}],
    "tools": [{"type": "function", "function": {"name": "get_weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "max_tokens": 4, "temperature": 0})");
  REQUIRE(r.status == 200);
  Json m = Json::parse(r.body)["choices"][0]["message"];
  CHECK(m["role"] == "assistant");
  CHECK((m["content"].is_string() || m["content"].is_null()));
}

TEST_CASE("serve: completions from text and ids, streamed, then tokenize and detokenize") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s;
  HttpResponse tk = s.post("/tokenize", R"({"prompt": "Hello world"})");
  REQUIRE(tk.status == 200);
  Json ids = Json::parse(tk.body)["tokens"];
  CHECK(ids.size() == 2);
  HttpResponse dt = s.post("/detokenize", Json{{"tokens", ids}}.dump());
  REQUIRE(dt.status == 200);
  CHECK(Json::parse(dt.body)["prompt"] == "Hello world");
  HttpResponse tc = s.post("/tokenize", R"({"messages": [{"role": "user", "content": "Hi"}]})");
  CHECK(Json::parse(tc.body)["count"].get<int>() > 10);

  HttpResponse a = s.post("/v1/completions",
                          R"({"prompt": "Hello world", "max_tokens": 5, "temperature": 0,
                              "logprobs": 1})");
  REQUIRE(a.status == 200);
  Json ja = Json::parse(a.body);
  CHECK(ja["object"] == "text_completion");
  CHECK(ja["usage"]["prompt_tokens"] == 2);
  CHECK(ja["usage"]["completion_tokens"] == 5);
  CHECK(ja["choices"][0]["logprobs"]["tokens"].size() == 5);
  HttpResponse b = s.post(
      "/v1/completions",
      Json{{"prompt", ids}, {"max_tokens", 5}, {"temperature", 0}, {"ignore_eos", true}}.dump());
  REQUIRE(b.status == 200);
  CHECK(Json::parse(b.body)["choices"][0]["text"] == ja["choices"][0]["text"]);
  HttpResponse c = s.post("/v1/completions", R"({"prompt": "Hello world", "max_tokens": 5,
      "temperature": 0, "stream": true, "stream_options": {"include_usage": true}})");
  auto events = sse_data(c.body);
  REQUIRE(events.size() >= 3);
  CHECK(events.back() == "[DONE]");
  std::string text;
  for (size_t i = 0; i + 2 < events.size(); ++i)
    text += Json::parse(events[i])["choices"][0]["text"].get<std::string>();
  CHECK(text == ja["choices"][0]["text"].get<std::string>());
  CHECK(Json::parse(events[events.size() - 2])["usage"]["total_tokens"] == 7);
}

TEST_CASE("serve: rejections carry the OpenAI error body") {
  XSERV_REQUIRE_DATA(data);
  server::ServeOptions opt;
  opt.api_key = "sekrit";
  opt.connections.max_body_bytes = 4096;
  TinyServer s(opt, 2, 64);
  const std::string auth = "Authorization: Bearer sekrit\r\n";
  HttpResponse no_key = s.post("/v1/chat/completions", kChat);
  CHECK(no_key.status == 401);
  CHECK(error_of(no_key)["code"] == "invalid_api_key");
  CHECK(s.post("/v1/chat/completions", kChat, "Authorization: Bearer wrong\r\n").status == 401);
  CHECK(http(s.port, "GET", "/health").status == 200); // no key needed
  CHECK(s.post("/v1/chat/completions", kChat, auth).status == 200);
  // RFC 9110: the scheme is case-insensitive; the key is not.
  CHECK(s.post("/v1/chat/completions", kChat, "Authorization: bearer sekrit\r\n").status == 200);
  CHECK(s.post("/v1/chat/completions", kChat, "Authorization: Bearer SEKRIT\r\n").status == 401);
  // /metrics is behind the key (ServeOptions::metrics_public opens it).
  CHECK(http(s.port, "GET", "/metrics").status == 401);
  CHECK(http(s.port, "GET", "/metrics", "", auth).status == 200);

  HttpResponse unknown =
      s.post("/v1/chat/completions",
             R"({"messages": [{"role": "user", "content": "x"}], "nope": 1})", auth);
  CHECK(unknown.status == 400);
  CHECK(error_of(unknown)["param"] == "nope");
  CHECK(error_of(unknown)["type"] == "invalid_request_error");
  HttpResponse model = s.post("/v1/completions", R"({"model": "llama", "prompt": "x"})", auth);
  CHECK(model.status == 404);
  CHECK(error_of(model)["code"] == "model_not_found");
  HttpResponse big =
      s.post("/v1/completions", R"({"prompt": ")" + std::string(5000, 'a') + R"("})", auth);
  CHECK(big.status == 413);
  error_of(big);
  // 70 ids against a max-seq of 64: both numbers named.
  Json long_prompt = {{"prompt", std::vector<int>(70, 1000)}};
  HttpResponse over = s.post("/v1/completions", long_prompt.dump(), auth);
  CHECK(over.status == 400);
  const std::string msg = error_of(over)["message"];
  CHECK(msg.find("70") != std::string::npos);
  CHECK(msg.find("64") != std::string::npos);
  CHECK(error_of(over)["code"] == "context_length_exceeded");
  CHECK(error_of(over)["n_prompt_tokens"] == 70); // llama.cpp's fields, for its clients
  CHECK(error_of(over)["n_ctx"] == 64);
  HttpResponse vocab = s.post("/v1/completions", R"({"prompt": [999999999]})", auth);
  CHECK(vocab.status == 400);
  CHECK(error_of(vocab)["param"] == "prompt");
  HttpResponse stop_id =
      s.post("/v1/completions", R"({"prompt": "x", "stop_token_ids": [999999999]})", auth);
  CHECK(stop_id.status == 400);
  CHECK(error_of(stop_id)["param"] == "stop_token_ids");
  CHECK(error_of(stop_id)["message"].get<std::string>().find("outside the model's vocabulary") !=
        std::string::npos);
  CHECK(s.post("/v1/chat/completions", "{oops", auth).status == 400);
}

TEST_CASE("serve: a request whose body's end is in doubt is refused and its connection closed") {
  XSERV_REQUIRE_DATA(data);
  server::ServeOptions opt;
  opt.connections.max_body_bytes = 4096;
  opt.api_key = "sekrit"; // checked after the framing, and none of these requests has it
  TinyServer s(opt, 2, 64);
  // Each request is followed on the same connection by a GET /health that must never be
  // answered: after a request of unknown length nothing on the stream is a request.
  const std::string next = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  struct Case {
    const char* headers;
    int status;
    const char* message;
    const char* body = "";
  };
  const std::vector<Case> cases = {
      {"Content-Length: abc\r\n", 400, "Content-Length is not a number of bytes"},
      {"Content-Length: -1\r\n", 400, "Content-Length is not a number of bytes"},
      {"Content-Length: 5\r\nContent-Length: 50\r\n", 400, "given again with another value"},
      {"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", 400, "together with Content-Length"},
      {"Transfer-Encoding: gzip\r\n", 400, "does not end in chunked"},
      {"", 411, "a POST request needs Content-Length"},
      {"Content-Length: 18446744073709551616\r\n", 413, "larger than the server's limit of 4096"},
      // A list of one value (RFC 9110 lets a recipient read it as 1), a space before the colon,
      // chunked twice: each a classic of request smuggling, refused.
      {"Content-Length: 1,1\r\n", 400, "Content-Length '1,1' is not a number of bytes", "{}"},
      {"Content-Length : 2\r\n", 400, "'Content-Length : 2' is not a field", "{}"},
      {"Transfer-Encoding: chunked, chunked\r\n", 400, "applies chunked twice", "0\r\n\r\n"},
      {"Transfer-Encoding: gzip, chunked\r\n", 501, "decodes chunked only", "0\r\n\r\n"},
      // Several Transfer-Encoding fields are one list; an empty one is refused. A length past
      // 2^64 after Transfer-Encoding is ambiguous, not merely too large.
      {"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n", 501, "decodes chunked only",
       "0\r\n\r\n"},
      {"Transfer-Encoding: \r\nTransfer-Encoding: chunked\r\n", 400, "given empty",
       "0\r\n\r\n"},
      {"Transfer-Encoding: chunked\r\nContent-Length: 99999999999999999999999\r\n", 400,
       "the body's end is ambiguous", "0\r\n\r\n"},
      {"Content-Length: 5000\r\n", 413, "larger than the server's limit of 4096"},
      // Well framed but refused before its body was read (no key): the body is not a request.
      {"Content-Length: 2\r\n", 401, "a valid API key is needed", "{}"},
      {"Transfer-Encoding: chunked\r\n", 401, "a valid API key is needed", "2\r\n{}\r\n0\r\n\r\n"},
  };
  for (const Case& c : cases) {
    INFO(c.headers);
    Socket sock(s.port);
    timeval tv{30, 0}; // a connection left open fails the case instead of hanging the test
    ::setsockopt(sock.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sock.send_all(std::string("POST /v1/completions HTTP/1.1\r\nHost: x\r\n") + c.headers + "\r\n" +
                  c.body + next);
    std::string raw;
    for (std::string part = sock.read_some(); !part.empty(); part = sock.read_some())
      raw += part;
    REQUIRE(raw.size() > 12);
    CHECK(std::stoi(raw.substr(9, 3)) == c.status);
    CHECK(raw.find("Connection: close") != std::string::npos);
    CHECK(parse_responses(raw).size() == 1); // one response: /health not answered
    const size_t body = raw.find("\r\n\r\n");
    REQUIRE(body != std::string::npos);
    CHECK(error_of({0, "", raw.substr(body + 4)})["message"].get<std::string>().find(c.message) !=
          std::string::npos);
  }
  CHECK(s.post("/v1/chat/completions", kChat, "Authorization: Bearer sekrit\r\n").status == 200);
}

TEST_CASE("serve: 256 idle keep-alive connections do not starve other requests") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s;
  std::vector<std::unique_ptr<Socket>> idle;
  for (int i = 0; i < 256; ++i) {
    idle.push_back(std::make_unique<Socket>(s.port));
    if (i % 2) // half after one kept-alive request, half without sending a byte
      idle.back()->send_all("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  }
  for (int i = 1; i < 256; i += 2)
    CHECK(idle[size_t(i)]->read_some().find("200 OK") != std::string::npos);
  HttpResponse r = s.post("/v1/chat/completions", kChat);
  CHECK(r.status == 200);
  CHECK(http(s.port, "GET", "/health").status == 200);
}

TEST_CASE("serve: a full queue answers 429 with Retry-After") {
  XSERV_REQUIRE_DATA(data);
  server::ServeOptions opt;
  opt.engine.max_running = 1;
  opt.engine.max_queue = 1;
  TinyServer s(opt);
  s.model.set_open(false);
  HttpResponse a, b;
  std::thread ta([&] { a = s.post("/v1/chat/completions", kChat); });
  s.model.wait_entered(1); // a's first step, admitted: it holds the only row
  s.model.release_one();
  s.model.wait_entered(2); // the step after it is held: the engine's counts are settled
  CHECK(s.server.stats().running == 1);
  CHECK(s.server.stats().waiting == 0);
  std::thread tb([&] { b = s.post("/v1/chat/completions", kChat); });
  CHECK(eventually([&] { return s.server.stats().waiting == 1; }));
  HttpResponse c = s.post("/v1/chat/completions", kChat);
  CHECK(c.status == 429);
  CHECK(c.headers.find("Retry-After:") != std::string::npos);
  CHECK(error_of(c)["code"] == "queue_full");
  s.model.set_open(true);
  ta.join();
  tb.join();
  CHECK(a.status == 200);
  CHECK(b.status == 200);
}

TEST_CASE("serve: a client that disconnects mid-stream frees its row") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s;
  Json body = Json::parse(kChat);
  body["stream"] = true;
  body["max_tokens"] = 120;
  {
    Socket sock(s.port);
    sock.send_all(http_request("POST", "/v1/chat/completions", body.dump()));
    std::string got;
    while (sse_data(dechunk(got.substr(std::min(got.size(), got.find("\r\n\r\n") + 4)))).size() <
           2) {
      std::string part = sock.read_some();
      REQUIRE_MESSAGE(!part.empty(), got); // the server must not end the stream by itself
      got += part;
    }
    CHECK(s.server.stats().running == 1);
  } // closes the connection
  CHECK(eventually([&] { return s.server.stats().running == 0; }));
  CHECK(s.server.stats().finished_abort == 1);
  CHECK(s.server.stats().generated_tokens < 120);
  CHECK(http(s.port, "GET", "/metrics").body.find("xserv:client_disconnects_total 1") !=
        std::string::npos);
  HttpResponse met = http(s.port, "GET", "/metrics");
  CHECK(met.body.find("xserv:kv_blocks_in_use 0") != std::string::npos);
  CHECK(eventually([&] {
    return http(s.port, "GET", "/metrics")
               .body.find("xserv:request_success_total{finished_reason=\"abort\"} 1") !=
           std::string::npos;
  }));
}

TEST_CASE("serve: a non-streaming client that disconnects frees its row") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s;
  s.model.set_open(false);
  {
    Socket sock(s.port);
    sock.send_all(http_request("POST", "/v1/chat/completions", kChat));
    s.model.wait_entered(1); // admitted, held in its first step
  }                          // the client goes away before any answer
  CHECK(eventually([&] {     // noticed while the step is still held
    return http(s.port, "GET", "/metrics").body.find("xserv:client_disconnects_total 1") !=
           std::string::npos;
  }));
  s.model.set_open(true);
  CHECK(eventually([&] { return s.server.stats().finished_abort == 1; }));
  CHECK(s.server.stats().running == 0);
  CHECK(s.server.stats().generated_tokens < 6);
}

TEST_CASE("serve: an engine failure is a 500, or an SSE error event after the stream began") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s;
  s.model.fail_next_step();
  HttpResponse plain = s.post("/v1/chat/completions", kChat);
  CHECK(plain.status == 500);
  CHECK(error_of(plain)["type"] == "server_error");
  Json body = Json::parse(kChat);
  body["stream"] = true;
  s.model.fail_next_step();
  HttpResponse st = s.post("/v1/chat/completions", body.dump());
  CHECK(st.status == 200);
  auto events = sse_data(st.body);
  REQUIRE(events.size() >= 3);
  CHECK(events.back() == "[DONE]");
  CHECK(Json::parse(events[events.size() - 2]).contains("error"));
  CHECK(s.post("/v1/chat/completions", kChat).status == 200); // and the server goes on
}

TEST_CASE("serve: non-finite logits are a 500 for that request alone, the server goes on") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s;
  s.model.poison_next_step();
  HttpResponse plain = s.post("/v1/chat/completions", kChat);
  CHECK(plain.status == 500);
  const Json err = error_of(plain);
  CHECK(err["type"] == "server_error");
  CHECK(err["message"].get<std::string>().find("non-finite logits (NaN or infinity) at engine "
                                               "step") != std::string::npos);
  CHECK(s.server.stats().finished_error == 1);
  CHECK(s.server.stats().running == 0); // its row is free
  Json body = Json::parse(kChat);
  body["stream"] = true;
  s.model.poison_next_step();
  HttpResponse st = s.post("/v1/chat/completions", body.dump());
  CHECK(st.status == 200); // the stream had begun: the error comes as its last event
  auto events = sse_data(st.body);
  REQUIRE(events.size() >= 2);
  CHECK(events.back() == "[DONE]");
  CHECK(Json::parse(events[events.size() - 2])["error"]["message"].get<std::string>().find(
            "non-finite logits") != std::string::npos);
  HttpResponse ok = s.post("/v1/completions", R"({"prompt": "Hi", "max_tokens": 3})");
  CHECK(ok.status == 200);
  CHECK(Json::parse(ok.body)["choices"][0]["finish_reason"] == "length");
}

TEST_CASE("serve: drain past the grace period aborts running streams cleanly") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s;
  Json body = Json::parse(kChat);
  body["stream"] = true;
  body["max_tokens"] = 150;
  s.model.set_open(false);
  HttpResponse r;
  std::thread t([&] { r = s.post("/v1/chat/completions", body.dump()); });
  s.model.wait_blocked();
  std::thread opener([&] { s.model.set_open(true); });
  s.server.drain(std::chrono::milliseconds(0));
  opener.join();
  t.join();
  REQUIRE(r.status == 200);
  auto events = sse_data(r.body);
  REQUIRE(events.size() >= 2);
  CHECK(events.back() == "[DONE]");
  // Cut short: no OpenAI finish reason says so, so an error event does (as vLLM's streams).
  const Json err = Json::parse(events[events.size() - 2])["error"];
  CHECK(err["code"] == "server_shutting_down");
  CHECK(err["message"].get<std::string>().find("the server is shutting down") != std::string::npos);
}

TEST_CASE("serve: SIGTERM lets the running request finish and exits 0 (xserv serve)") {
  XSERV_REQUIRE_DATA(data);
  const TempDir tmp("serve_sigterm");
  const fs::path log = tmp.path / "stderr.txt";
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    FILE* f = std::freopen(log.c_str(), "w", stderr);
    (void)f;
    const std::string model = tiny_model().string(), tok = (data / "o200k_base.tiktoken");
    execl(XSERV_BINARY, XSERV_BINARY, "serve", model.c_str(), "--port", "0", "--backend", "cpu",
          "--max-seq", "128", "--max-batch", "2", "--tokenizer", tok.c_str(), "--grace", "600",
          static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  auto read_log = [&] {
    std::ifstream in(log);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  int port = 0;
  REQUIRE(eventually([&] {
    std::string text = read_log();
    size_t at = text.find("[serve] ready: model 'gpt-oss' at http://127.0.0.1:");
    if (at == std::string::npos)
      return false;
    port = std::stoi(text.substr(at + 51));
    return true;
  }));
  CHECK(http(port, "GET", "/health").status == 200);
  Json body = Json::parse(kChat);
  body["stream"] = true;
  body["max_tokens"] = 24;
  HttpResponse r;
  std::thread t([&] { r = http(port, "POST", "/v1/chat/completions", body.dump()); });
  REQUIRE(eventually([&] {
    return http(port, "GET", "/metrics").body.find("xserv:num_requests_running 1") !=
           std::string::npos;
  }));
  kill(pid, SIGTERM);
  t.join();
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  auto events = sse_data(r.body);
  REQUIRE(events.size() >= 2);
  CHECK(events.back() == "[DONE]");
  CHECK(Json::parse(events[events.size() - 2])["choices"][0]["finish_reason"] == "length");
  const std::string text = read_log();
  CHECK(text.find("[serve] signal 15: draining") != std::string::npos);
  CHECK(text.find("output 24") != std::string::npos); // the request's log line
}

TEST_CASE("serve: a --pp 2 plan serves through its worker, with the pp 1 plan's tokens") {
  XSERV_REQUIRE_DATA(data);
  const TempDir tmp("serve_pp2");
  const std::string model = tiny_model().string();
  std::string text[2];
  for (int pp : {1, 2}) {
    const fs::path plan = tmp.path / ("pp" + std::to_string(pp));
    REQUIRE(run_xserv("compile " + model + " -o " + plan.string() + " --pp " + std::to_string(pp) +
                      " --max-batch 2 --max-seq 128 --no-cubins")
                .code == 0);
    const auto [pid, port] =
        serve_process(plan, tmp.path / ("log" + std::to_string(pp)), data / "o200k_base.tiktoken");
    const std::string greedy = R"({"prompt": [11, 22, 33, 44], "max_tokens": 8, "temperature": 0})";
    const HttpResponse r = http(port, "POST", "/v1/completions", greedy);
    CHECK(r.status == 200);
    const Json j = Json::parse(r.body);
    CHECK(j["usage"]["completion_tokens"] == 8);
    text[pp - 1] = j["choices"][0]["text"].get<std::string>();
    kill(pid, SIGTERM); // the worker goes with rank 0
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  CHECK(!text[0].empty());
  CHECK(text[1] == text[0]);
}

namespace {

/// The pid of a child process of `parent` whose command line holds `word`, or -1.
pid_t child_with(pid_t parent, const std::string& word) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos)
      continue;
    const std::string stat = read_text(e.path() / "stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos)
      continue;
    std::istringstream rest(stat.substr(close + 2));
    std::string state;
    pid_t ppid = -1;
    rest >> state >> ppid;
    std::string cmd = read_text(e.path() / "cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (ppid == parent && cmd.find(word) != std::string::npos)
      return static_cast<pid_t>(std::stoi(name));
  }
  return -1;
}

} // namespace

TEST_CASE("serve: a --pp 2 plan whose worker dies answers 503, /health turns 503, exits 1") {
  XSERV_REQUIRE_DATA(data);
  const TempDir tmp("serve_pp2_broken");
  const fs::path plan = tmp.path / "pp2", log = tmp.path / "log";
  REQUIRE(run_xserv("compile " + tiny_model().string() + " -o " + plan.string() +
                    " --pp 2 --max-batch 2 --max-seq 128 --no-cubins")
              .code == 0);
  const auto [pid, port] =
      serve_process(plan, log, data / "o200k_base.tiktoken", {}, {"XSERV_PIPELINE_TIMEOUT=2"});
  const std::string greedy = R"({"prompt": [11, 22, 33, 44], "max_tokens": 4, "temperature": 0})";
  CHECK(http(port, "POST", "/v1/completions", greedy).status == 200);
  const pid_t worker = child_with(pid, "worker");
  REQUIRE(worker > 0);
  ::kill(worker, SIGKILL);
  // The next step finds rank 1 gone (a hung one: within XSERV_PIPELINE_TIMEOUT): a clear 503
  // naming it, not a 500.
  const HttpResponse r = http(port, "POST", "/v1/completions", greedy);
  CHECK(r.status == 503);
  CHECK(error_of(r)["code"] == "model_broken");
  CHECK(error_of(r)["message"].get<std::string>().find("pipeline rank 1") != std::string::npos);
  // /health says so while the server lingers, then it exits 1 for its supervisor.
  const HttpResponse h = http(port, "GET", "/health");
  CHECK(h.status == 503);
  CHECK(Json::parse(h.body)["status"] == "broken");
  CHECK(Json::parse(h.body)["reason"].get<std::string>().find("pipeline rank 1") !=
        std::string::npos);
  CHECK(http(port, "POST", "/v1/completions", greedy).status == 503);
  CHECK(wait_exit(pid, std::chrono::seconds(60)) == 1);
  const std::string text = read_text(log);
  CHECK(text.find("[serve] the model can serve no more: pipeline rank 1") != std::string::npos);
  CHECK(text.find("exiting with status 1") != std::string::npos);
}

TEST_CASE("serve: xserv eval --endpoint scores GSM8K through the server") {
  XSERV_REQUIRE_DATA(data);
  TinyServer s;
  const TempDir tmp("serve_eval");
  const fs::path problems = tmp.path / "gsm8k.jsonl", out = tmp.path / "out.jsonl";
  std::ofstream(problems) << R"({"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"})"
                          << "\n"
                          << R"({"question": "What is 4 * 4?", "answer": "16\n#### 16"})"
                          << "\n";
  const std::string common = "eval --endpoint http://127.0.0.1:" + std::to_string(s.port) +
                             "/v1 --task gsm8k --data " + problems.string() +
                             " --max-tokens 3 --batch 2";
  RunResult r = run_xserv(common + " --out " + out.string(), "", true);
  INFO(r.err);
  CHECK(r.code == 0);
  CHECK(r.out.find("samples     2") != std::string::npos);
  CHECK(r.err.find("(model gpt-oss)") != std::string::npos);
  std::ifstream in(out);
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines) {
    Json j = Json::parse(line);
    CHECK(j["tokens"] == 3);
    CHECK(!j.contains("error"));
    CHECK(j["reference"].is_string());
  }
  CHECK(lines == 2);
  RunResult bad = run_xserv(common + " --model other", "", true);
  CHECK(bad.code == 1); // every request failed: 404 from the server
  CHECK(bad.err.find("HTTP 404") != std::string::npos);
}
