// libFuzzer target: any byte string as the body of POST /v1/chat/completions (first byte even),
// /v1/responses (3 modulo 4) or /v1/completions (the other odd bytes) is parsed as serve does
// (parse_body, then the typed request; a Responses body through its chat translation) and
// either accepted or refused with an ApiError whose error body serialises as serve sends it;
// nothing else may happen (an nlohmann exception escaping would be a 500 without a field).
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "server/openai_request.h"
#include "server/openai_responses.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace xserv::server::openai;
  if (size == 0)
    return 0;
  const bool chat = data[0] % 2 == 0, responses = data[0] % 4 == 3;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    const Json j = parse_body(body);
    if (chat)
      (void)parse_chat_request(j);
    else if (responses)
      (void)parse_responses_chat(parse_responses_request(j));
    else
      (void)parse_completion_request(j);
  } catch (const ApiError& e) {
    // serve's dump_json: invalid UTF-8 in a message (an echoed field name) is replaced.
    (void)error_body(e).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  } catch (const xserv::Error& e) {
    // serve answers these 400 with the message as given.
    (void)error_body(ApiError(400, e.what()))
        .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  return 0;
}
