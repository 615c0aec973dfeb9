// UTF-8 validity, for text that must be valid before it goes into JSON or a tensor name.
#pragma once

#include <string_view>

namespace xserv {

/// Whether `s` is well-formed UTF-8: no overlong forms, surrogates or values past U+10FFFF (as
/// Rust's from_utf8 judges it).
bool valid_utf8(std::string_view s);

} // namespace xserv
