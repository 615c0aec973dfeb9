// nlohmann::json's exception text without its "[json.exception.parse_error.101] " prefix, for
// messages that name the file or field themselves and should not read as a library's.
#pragma once

#include <string>

namespace xserv::models {

/// `what` (an nlohmann::json exception's what()) from the first character after its bracketed
/// "[json.exception....]" tag; `what` unchanged when it has none.
inline std::string json_error_text(const std::string& what) {
  if (what.rfind("[json.exception.", 0) != 0)
    return what;
  const size_t end = what.find("] ");
  return end == std::string::npos ? what : what.substr(end + 2);
}

} // namespace xserv::models
