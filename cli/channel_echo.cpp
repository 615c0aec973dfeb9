// ChannelEcho: a harmony reply's channels on stdout, for run and chat.
#include <iostream>

#include "cli/commands.h"

namespace xserv::cli {

void ChannelEcho::print(const std::string& channel, const std::string& text) {
  if (channel != "final" && !(show_ && !channel.empty()))
    return;
  if (show_ && channel != last_)
    std::cout << (last_.empty() ? "" : "\n") << "[" << channel << "] ";
  last_ = channel;
  std::cout << text << std::flush;
}

} // namespace xserv::cli
