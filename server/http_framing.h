// How an HTTP request's body is delimited, checked before cpp-httplib reads it: the library parses
// Content-Length with strtoull (so "abc" reads as an empty body and "-1" as 2^64 - 1), takes the
// first of two Content-Length headers, lets Transfer-Encoding win over Content-Length silently,
// reads a chunked body with no size limit and a POST without either until the client closes. A
// request whose end is in doubt is refused here (cli/serve_server.cpp's pre-routing gate) and its
// connection closed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <httplib.h>

#include "server/openai_request.h"

namespace xserv::server {

/// The first problem with how a request of `method` with `headers` delimits its body, or
/// nullopt when the library may read it:
/// - Content-Length: decimal digits only (400 otherwise: "abc", "-1", "+5", "1,1"), the same
///   number when given more than once (400; compared as written but for leading zeros, so two
///   past 2^64 differ), at most `max_body` bytes (413, before any is read; past 2^64 always);
/// - Transfer-Encoding: never with Content-Length (400: the two disagree on where the body
///   ends), no coding but chunked (400), and chunked bodies are refused too (411: cpp-httplib
///   0.11 does not hold them to --max-body, so one could fill memory);
/// - POST, PUT, PATCH and DELETE need Content-Length (411); GET and HEAD carry no body (400 for
///   a non-zero Content-Length or any Transfer-Encoding: the library would read the body as
///   the next request).
std::optional<openai::ApiError>
check_body_framing(const std::string& method, const httplib::Headers& headers, uint64_t max_body);

} // namespace xserv::server
