// ChannelEcho: what `xserv run --prompt` and `xserv chat` print of a harmony reply's channels.
#include <doctest/doctest.h>

#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"

using xserv::cli::ChannelEcho;

namespace {

/// What an echo prints of (channel, text) pieces, in order.
std::string echoed(bool show_reasoning,
                   const std::vector<std::pair<std::string, std::string>>& pieces,
                   bool* printed = nullptr) {
  std::ostringstream out;
  std::streambuf* saved = std::cout.rdbuf(out.rdbuf());
  ChannelEcho echo(show_reasoning);
  for (const auto& [channel, text] : pieces)
    echo.print(channel, text);
  std::cout.rdbuf(saved);
  if (printed)
    *printed = echo.printed();
  return out.str();
}

} // namespace

TEST_CASE("ChannelEcho prints the final channel, and with reasoning every channel, tagged") {
  // Text before any channel (the header's), analysis, then the final answer in two pieces.
  const std::vector<std::pair<std::string, std::string>> reply = {
      {"", "ignored"}, {"analysis", "Think"}, {"analysis", "ing."}, {"final", "4"}, {"final", "2"}};
  bool printed = false;
  CHECK(echoed(false, reply, &printed) == "42");
  CHECK(printed);
  CHECK(echoed(true, reply) == "[analysis] Thinking.\n[final] 42");
  // A channel again after another gets its tag again; the first tag has no newline before it.
  CHECK(echoed(true, {{"commentary", "a"}, {"final", "b"}, {"commentary", "c"}}) ==
        "[commentary] a\n[final] b\n[commentary] c");
  // Only analysis, without --show-reasoning: nothing printed (chat then says there was no reply).
  CHECK(echoed(false, {{"analysis", "x"}}, &printed).empty());
  CHECK_FALSE(printed);
  CHECK(echoed(false, {}, &printed).empty());
  CHECK_FALSE(printed);
}
