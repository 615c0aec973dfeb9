// libFuzzer target: the request-to-grammar path of structured output. Any byte string as the body
// of POST /v1/chat/completions (first byte even) or /v1/completions (odd) is parsed as serve
// does; what it asks to enforce (response_format, strict tools, json_schema, regex, grammar) is
// compiled, and then the first allowed token is taken for up to 16 steps. A body is accepted or
// refused with an ApiError or xserv::Error (a ConstraintError names its field); nothing else may
// happen: no crash, no escaping exception from the grammar engine, no state that allows nothing
// while it binds. The vocabulary is a small byte-level one with the harmony specials, so that a
// grammar compiles in microseconds (the path is the same for o200k's 201,088 ids).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/constraint.h"
#include "models/tokenizer.h"
#include "models/tokenizer_impl.h"
#include "server/openai_request.h"

namespace {

using xserv::models::TokenId;

const xserv::engine::ConstraintCompiler& compiler() {
  static const xserv::engine::ConstraintCompiler c = [] {
    std::vector<std::string> ordinary;
    for (int b = 0; b < 256; ++b)
      ordinary.emplace_back(1, static_cast<char>(b));
    for (const char* m : {"{\"", "\": ", ", \"", "true", "false", "null", "\"}", "12", "abc",
                          "final", "analysis", "commentary", " to=functions.f"})
      ordinary.emplace_back(m);
    const auto n = static_cast<TokenId>(ordinary.size());
    auto tok = xserv::models::TokenizerBuilder::build(
        std::move(ordinary),
        {{n, "<|start|>"}, {n + 1, "<|end|>"}, {n + 2, "<|message|>"}, {n + 3, "<|channel|>"},
         {n + 4, "<|return|>"}, {n + 5, "<|call|>"}, {n + 6, "<|constrain|>"}},
        n + 8, "fuzz vocabulary");
    return xserv::engine::ConstraintCompiler(tok, n + 8,
                                             {int32_t(n + 4), int32_t(n + 5)}, 1);
  }();
  return c;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace xserv::server::openai;
  using xserv::engine::ConstraintState;
  if (size == 0)
    return 0;
  const bool chat = data[0] % 2 == 0;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    const Json j = parse_body(body);
    const GenParams p = chat ? parse_chat_request(j).params : parse_completion_request(j).params;
    if (p.constraint.empty())
      return 0;
    ConstraintState state(compiler().compile(p.constraint));
    const int64_t vocab = compiler().vocab_size();
    std::vector<uint32_t> mask(ConstraintState::mask_words(vocab));
    for (int step = 0; step < 16 && (state.bound() || p.constraint.harmony); ++step) {
      int32_t pick = -1;
      if (state.bound()) {
        std::fill(mask.begin(), mask.end(), 0u);
        state.fill_mask(mask);
        for (int64_t t = 0; t < vocab && pick < 0; ++t)
          if (mask[size_t(t / 32)] >> (t % 32) & 1u)
            pick = int32_t(t);
        if (pick < 0)
          std::abort(); // a bound state that allows nothing: compile() should have refused
      } else {
        pick = int32_t(data[step % size]); // free harmony headers: any byte token
      }
      if (!state.accept(pick) && state.bound())
        std::abort(); // a token its own mask allowed was refused
    }
  } catch (const ApiError&) {
  } catch (const xserv::Error&) {
  }
  return 0;
}
